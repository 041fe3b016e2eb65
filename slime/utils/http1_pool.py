"""`Http1Pool`: keep-alive HTTP/1.1 connections for the requests slime sends most, on asyncio protocols.

Why not aiohttp's client for these: a rollout sends one small JSON `/generate` per sample (and the agent
gateway one per turn) to the router or an engine, and aiohttp's client spends ~680k instructions a request in
the client process (its request and response objects, timers, cookie and redirect handling, stream readers)
against ~290k for the same request written here (`bench/bench_http_client.py`). What is kept is what these
requests need: a pool of idle connections per host, the response parsed by `httptools` (llhttp, the parser
uvicorn serves with), a deadline per request, and a connection closed (never reused) on any failure,
timeout or cancellation, so a server sees its client leave (SGLang and sglang-router abort the request
then). Plain `http://` only; `request_json` keeps aiohttp for anything else.

Failures say how far the request got, which decides whether it may still run on the server:
`NotConnected` (nothing sent), `ConnectionDropped` (sent, no answer began: it may still run), `AnswerCut`
(an answer began and was cut: the server is done with it).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import httptools


class NotConnected(ConnectionError):
    """The connection could not be opened: nothing was sent."""


class ConnectionDropped(ConnectionError):
    """The connection closed after the request was sent and before any answer began."""


class AnswerCut(ConnectionError):
    """The answer began and the connection closed (or the answer broke HTTP) before it ended."""


@dataclass(frozen=True)
class Target:
    """Where a URL's request goes: the host and port to connect to, the Host header, the request target."""

    host: str
    port: int
    authority: bytes
    path: bytes


# what a request target may hold as it is (RFC 3986's unreserved, reserved and '%'); anything else (a space, a
# control character, non-ASCII) is percent-encoded, as aiohttp's URL type does, so no URL can split the request
_TARGET_SAFE = "/?#[]@!$&'()*+,;=:-._~%"
# a header name or value that could end the header early (request splitting): refused, as aiohttp refuses it
_HEADER_BREAK = re.compile(r"[\r\n\x00]")


def parse_target(url: str) -> Target | None:
    """`url`'s target, or None when this pool cannot send it (not `http://`)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return None
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return Target(
        parts.hostname, parts.port or 80, parts.netloc.encode("idna"), quote(path, safe=_TARGET_SAFE).encode()
    )


def header_lines(headers: dict[str, str]) -> list[bytes]:
    """`Name: value` lines; a name or value holding CR, LF or NUL is refused (`ValueError`)."""
    lines = []
    for name, value in headers.items():
        if _HEADER_BREAK.search(name) or _HEADER_BREAK.search(value):
            raise ValueError(f"HTTP header {name!r}: CR, LF and NUL are not allowed in a header")
        lines.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
    return lines


@dataclass
class Answer:
    """One whole response: its status, headers (names lower-case, the last of repeated ones) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").partition(";")[0].strip().lower()


class _Connection(asyncio.Protocol):
    """One TCP connection; one request at a time (no pipelining)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.began = False  # some bytes of the answer arrived
        self.head_done = False  # the answer's status line and headers arrived whole
        self.closed = False
        self.reusable = False
        self.idle_since = 0.0  # loop time when it last went back to the pool

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # bytes nobody asked for (an idle connection): its framing can no longer be trusted
            self.fail(ConnectionDropped("the server wrote to an idle connection"))
            return
        self.began = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self.fail(AnswerCut(f"the answer is not HTTP/1.1: {e}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done() and self.began and self._ends_at_close():
            self.on_message_complete()  # an answer with neither a length nor chunks ends with its connection
            return
        self.fail(
            AnswerCut("the connection closed mid-answer")
            if self.began
            else ConnectionDropped("the connection closed before an answer began")
        )

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self.waiter is None or self.waiter.done():  # a second answer to one request (in the same bytes)
            self.fail(ConnectionDropped("the server wrote more than one answer"))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        self.reusable = not self.closed and self.parser.should_keep_alive()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in self.headers}
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        waiter.set_result(Answer(self.parser.get_status_code(), headers, body))

    def _ends_at_close(self) -> bool:
        names = {k.lower() for k, _ in self.headers}
        return self.head_done and b"content-length" not in names and b"transfer-encoding" not in names

    def fail(self, error: BaseException) -> None:
        """Close the connection; the request on it (if any) fails with `error`."""
        self.closed = True
        self.reusable = False
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)
        if self.transport is not None:
            self.transport.close()

    def send(self, pieces: list[bytes], loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        """Write the request's pieces: one copy on Python 3.11 (the transport joins them), none on 3.12+ (sendmsg)."""
        self.waiter = loop.create_future()
        self.headers, self.body, self.began, self.head_done, self.reusable = [], [], False, False, False
        self.transport.writelines(pieces)
        return self.waiter


def _expire(connection: _Connection, timeout: float) -> None:
    connection.fail(TimeoutError(f"no answer within {timeout:.1f}s"))


class Http1Pool:
    """Idle keep-alive connections per (host, port), made on and used from one event loop.

    A connection idle for `keep_idle` seconds is closed instead of reused: a server closes idle connections
    on its own clock (uvicorn, which SGLang and our engines serve with, after 5 s), and a request written
    as its close is on the way would fail for nothing."""

    MAX_TARGETS = 256  # parsed URLs kept (a rollout asks a handful: the router's and each engine's)
    KEEP_IDLE = 4.0  # seconds; under uvicorn's default keep-alive timeout (5 s)

    def __init__(self, keep_idle: float = KEEP_IDLE) -> None:
        self.keep_idle = keep_idle
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._targets: dict[str, Target | None] = {}
        self._busy: set[_Connection] = set()
        self.closed = False

    def target(self, url: str) -> Target | None:
        """`url` parsed (cached), or None when this pool cannot send it (`parse_target`)."""
        try:
            return self._targets[url]
        except KeyError:
            if len(self._targets) >= self.MAX_TARGETS:
                self._targets.clear()
            target = self._targets[url] = parse_target(url)
            return target

    async def request(
        self,
        method: str,
        target: Target,
        body: bytes | list[bytes] | None,
        *,
        timeout: float,
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Answer:
        """Send one request (its `body` one bytes object, or pieces written one after another) on an idle
        connection (or a new one) and read its whole answer, within `timeout` seconds from the call
        (`TimeoutError` after it); `NotConnected`, `ConnectionDropped` or `AnswerCut` when the connection
        fails, which is then closed, as on a timeout or cancellation."""
        if self.closed:
            raise RuntimeError("this Http1Pool is closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        key = (target.host, target.port)
        idle = self._idle.get(key)
        head = [b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (method.encode(), target.path, target.authority)]
        if headers:
            head.extend(header_lines(headers))
        if body is not None:
            if not headers or not any(k.lower() == "content-type" for k in headers):
                head.append(b"Content-Type: %s\r\n" % content_type.encode())
            pieces = [body] if isinstance(body, bytes) else body
            head.append(b"Content-Length: %d\r\n" % sum(map(len, pieces)))
        head.append(b"\r\n")
        if body:
            head += pieces
        connection = None
        stale = loop.time() - self.keep_idle
        while idle:  # the most recently used first; a closed one, or one idle too long, is dropped
            candidate = idle.pop()
            if not candidate.closed and candidate.idle_since > stale:
                connection = candidate
                break
            candidate.fail(ConnectionDropped("idle too long"))
        if connection is None:
            connection = await self._connect(loop, target, timeout)
        self._busy.add(connection)
        timer = loop.call_at(deadline, _expire, connection, timeout)
        try:
            answer = await connection.send(head, loop)
        except BaseException:  # failed, timed out or cancelled: never reused, so the server sees us leave
            connection.fail(ConnectionDropped("the request was abandoned"))
            raise
        finally:
            timer.cancel()
            self._busy.discard(connection)
            connection.waiter = None
        if connection.reusable and not self.closed:
            connection.idle_since = loop.time()
            self._idle.setdefault(key, []).append(connection)
        else:
            connection.fail(ConnectionDropped("closed after its answer"))
        return answer

    async def _connect(self, loop: asyncio.AbstractEventLoop, target: Target, timeout: float) -> _Connection:
        try:
            async with asyncio.timeout(timeout):
                _, connection = await loop.create_connection(_Connection, target.host, target.port)
        except TimeoutError as e:
            raise NotConnected(f"cannot connect to {target.host}:{target.port} within {timeout:.1f}s") from e
        except OSError as e:
            raise NotConnected(f"cannot connect to {target.host}:{target.port}: {e}") from e
        return connection

    async def close(self) -> None:
        """Close every connection, idle or busy (a busy one's request fails with `ConnectionDropped`)."""
        self.closed = True
        connections = [c for idle in self._idle.values() for c in idle] + list(self._busy)
        self._idle.clear()
        for connection in connections:
            connection.fail(ConnectionDropped("the pool was closed"))
        await asyncio.sleep(0)  # the transports' close callbacks run
