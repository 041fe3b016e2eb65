"""Issue 23: a session's egress may listen on an unprivileged port (so an adapter on the host can sit on
the same number without root). It is safe because the port is bound before the session's first command
and held until the session ends: code inside cannot bind it on any loopback or wildcard address, with
or without SO_REUSEADDR / SO_REUSEPORT, and ``[::1]`` on that port refuses instead of reaching a run."""

from __future__ import annotations

import http.server
import threading

import pytest
import requests

from tests.test_sandbox import ISOLATED

pytestmark = pytest.mark.skipif(not ISOLATED, reason="the egress needs namespaces/uid switching")


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


TAKE_OVER = """
import os, socket, urllib.request
port = int(os.environ["SLIME_EGRESS_URL"].rsplit(":", 1)[1])
for host, reuse in [("127.0.0.1", ""), ("0.0.0.0", ""), ("127.0.0.1", "addr+port"), ("0.0.0.0", "addr+port"),
                    ("::", ""), ("::1", ""), ("::1", "addr+port")]:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    if reuse:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        s.bind((host, port))
        s.listen()
        print(host, reuse, "taken")
    except OSError as e:
        print(host, reuse, e.errno)
v6 = socket.socket(socket.AF_INET6)
print("connect ::1", v6.connect_ex(("::1", port)))
print(urllib.request.urlopen(os.environ["SLIME_EGRESS_URL"], timeout=10).read().decode())
"""


def test_code_inside_cannot_take_an_unprivileged_egress_port_over(tmp_path):
    from slime.sandbox.server import start_local_sandbox
    from slime.utils.misc import find_free_port

    target = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    port = find_free_port()
    assert port >= 1024
    try:
        url, handle = start_local_sandbox(
            max_concurrency=1,
            extra_args=["--egress", f"gateway=127.0.0.1:{target.server_address[1]}", "--egress-port", str(port)],
        )
        try:
            opened = requests.post(f"{url}/sessions", json={"egress": "gateway"}, timeout=60).json()
            assert opened["egress_url"] == f"http://127.0.0.1:{port}"
            run = requests.post(
                f"{url}/sessions/{opened['session_id']}/exec",
                timeout=120,
                json={"command": "python3 -", "stdin": TAKE_OVER, "timeout": 60},
            ).json()
            requests.delete(f"{url}/sessions/{opened['session_id']}", timeout=60)
        finally:
            handle.stop()
    finally:
        target.shutdown()
        target.server_close()
    in_use, refused = 98, 111  # EADDRINUSE, ECONNREFUSED
    assert (run["returncode"], run["stderr"]) == (0, "")
    assert run["stdout"].splitlines() == [
        f"127.0.0.1  {in_use}",
        f"0.0.0.0  {in_use}",
        f"127.0.0.1 addr+port {in_use}",
        f"0.0.0.0 addr+port {in_use}",
        f"::  {in_use}",
        f"::1  {in_use}",
        f"::1 addr+port {in_use}",
        f"connect ::1 {refused}",
        "ok",
    ]
