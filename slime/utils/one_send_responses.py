"""`OneSendResponses`: uvicorn's HTTP/1.1 protocol, a response's head sent with its body.

uvicorn writes a response's status line and headers (at `http.response.start`) and its body (at
`http.response.body`) with a `transport.write` each, and uvloop sends each at once: two `send`
syscalls per answer, and the client woken twice (`strace` of the agent gateway: one `writev` to the
engine, then two `write`s back to the agent, per turn). Here the head waits for whatever is written
next in the same turn of the event loop, and both leave in one send; a head with nothing after it
(a HEAD request, a stream whose first chunk comes later) goes out at the end of that turn. Order is
kept: the held head is always written before anything after it, and before a close.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_HEAD_START, _HEAD_END = b"HTTP/1.1 ", b"\r\n\r\n"


class HeadWithBody:
    """The connection's transport, a response head held until the next write (or the loop's turn
    ends); everything else is the transport's own."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._head: bytes | None = None
        self._flush: asyncio.Handle | None = None

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._flush.cancel()
            self._transport.write(head + data)
        elif type(data) is bytes and data.startswith(_HEAD_START) and data.endswith(_HEAD_END):  # uvicorn's head
            self._head = data
            self._flush = self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def __getattr__(self, name: str) -> Any:  # pause_reading, resume_reading, abort, ...
        return getattr(self._transport, name)


class OneSendResponses(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(HeadWithBody(transport, self.loop))
