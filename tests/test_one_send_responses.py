"""uvicorn's protocol under `OneSendResponses` writes a response's head and body in one write, in
order, and a head with nothing after it in the same turn of the loop (HEAD, a stream) still goes out."""

from __future__ import annotations

import asyncio

import uvicorn
from uvicorn.server import ServerState

from slime.utils.one_send_responses import OneSendResponses


class Recorded(asyncio.Transport):
    """A transport that keeps what is written, as one entry per write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name, default=None):
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def app(scope, receive, send):
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one", b"two"):
            await asyncio.sleep(0)  # a stream's chunks come in later turns of the loop
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b"HTTP/1.1 200 OK\r\n\r\n" if scope["path"] == "/tricky" else b'{"ok": true}'  # a body like a head
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


async def exchange(request: bytes) -> list[bytes]:
    config = uvicorn.Config(app, lifespan="off", log_level="warning")
    protocol = OneSendResponses(
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop()
    )
    transport = Recorded()
    protocol.connection_made(transport)
    protocol.data_received(request)
    for _ in range(20):  # the app's task and the flushes: a few turns of the loop
        await asyncio.sleep(0)
    protocol.connection_lost(None)
    return transport.writes


def test_head_and_body_in_one_write_in_order():
    for path in ("/json", "/tricky"):
        writes = asyncio.run(exchange(f"GET {path} HTTP/1.1\r\nHost: a\r\n\r\n".encode()))
        assert len(writes) == 1, writes
        head, body = writes[0].split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200 OK") and b"content-length" in head
        assert body == (b"HTTP/1.1 200 OK\r\n\r\n" if path == "/tricky" else b'{"ok": true}')


def test_a_head_alone_still_goes_out():
    (head,) = asyncio.run(exchange(b"HEAD /json HTTP/1.1\r\nHost: a\r\n\r\n"))  # no body is written for HEAD
    assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")
    writes = asyncio.run(exchange(b"GET /stream HTTP/1.1\r\nHost: a\r\n\r\n"))
    assert writes[0].startswith(b"HTTP/1.1 200 OK") and writes[0].endswith(b"\r\n\r\n")  # before the first chunk
    assert b"".join(writes[1:]) == b"3\r\none\r\n3\r\ntwo\r\n0\r\n\r\n"
