"""`start_ok_server`: a tiny HTTP target on 127.0.0.1 (a free port, a daemon thread) for tests and benchmarks
that need something to reach: GET answers ``ok``, and ``/bulk/<MB>`` that many MiB of ``x``."""

from __future__ import annotations

import http.server
import threading

_MIB = b"x" * (1 << 20)


class _OkHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # (keep-alive: a benchmark measures requests on one connection)
    disable_nagle_algorithm = True  # (else every small answer waits for a delayed ACK)

    def do_GET(self):  # noqa: N802 - http.server's name
        mb = int(self.path.rsplit("/", 1)[1]) if self.path.startswith("/bulk/") else 0
        self.send_response(200)
        self.send_header("content-length", str(mb << 20 if mb else 2))
        self.end_headers()
        for _ in range(mb):
            self.wfile.write(_MIB)
        if not mb:
            self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def start_ok_server() -> http.server.ThreadingHTTPServer:
    """Serving once this returns; the caller ends it with `.shutdown()`, then `.server_close()` (which
    closes the listening socket) (its port: `.server_address[1]`)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OkHandler)
    threading.Thread(target=server.serve_forever, daemon=True, name="ok-server").start()
    return server
