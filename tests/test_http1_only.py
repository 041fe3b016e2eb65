"""Our engine servers close an HTTP/2 preface (sglang-router's gRPC probe) without logging
"Invalid HTTP request received.", and still serve HTTP/1.1 and report other unparsable requests."""

from __future__ import annotations

import logging
import socket

import requests
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from slime.testing.threaded_server import ThreadedServer

# what sglang-router's gRPC probe sends first: HTTP/2's connection preface, then a SETTINGS frame
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x18\x04\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00"


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def send_raw(port: int, data: bytes) -> bytes:
    """What the server answers `data` with before it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
        return b"".join(chunks)


def test_http2_preface_closed_quietly_http1_served_garbage_reported():
    app = Starlette(routes=[Route("/health", lambda request: PlainTextResponse("ok"))])
    server = ThreadedServer(app, "127.0.0.1", what="test server")
    port = server.port
    server.start(timeout=20)
    records = Records()
    log = logging.getLogger("uvicorn.error")
    log.addHandler(records)
    try:
        assert send_raw(port, PREFACE) == b""  # closed, nothing answered
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=10).text == "ok"
        assert not any("Invalid HTTP request" in m for m in records.messages), records.messages
        answer = send_raw(port, b"NOT AN HTTP REQUEST\x00\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400")
        assert any("Invalid HTTP request" in m for m in records.messages), records.messages
    finally:
        log.removeHandler(records)
        server.stop()
