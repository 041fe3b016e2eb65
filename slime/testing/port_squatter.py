"""`squatting(port)`: another server holding a port on 127.0.0.1 and answering every GET with 200, as another
run's engine answers `/health` on a port that was picked free and then taken (`child_process.listens_on`)."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator


class _Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def squatting(port: int) -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Healthy)
    threading.Thread(target=server.serve_forever, name=f"squatter-{port}", daemon=True).start()
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()
