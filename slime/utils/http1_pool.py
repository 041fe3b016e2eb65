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
from dataclasses import dataclass
from urllib.parse import urlsplit

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


def parse_target(url: str) -> Target | None:
    """`url`'s target, or None when this pool cannot send it (not `http://`)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return None
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return Target(parts.hostname, parts.port or 80, parts.netloc.encode("idna"), path.encode())


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
        self.closed = False
        self.reusable = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
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
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

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
        return bool(self.headers) and b"content-length" not in names and b"transfer-encoding" not in names

    def fail(self, error: BaseException) -> None:
        """Close the connection; the request on it (if any) fails with `error`."""
        self.closed = True
        self.reusable = False
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)
        if self.transport is not None:
            self.transport.close()

    def send(self, data: bytes, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        self.waiter = loop.create_future()
        self.headers, self.body, self.began, self.reusable = [], [], False, False
        self.transport.write(data)
        return self.waiter


def _expire(connection: _Connection, timeout: float) -> None:
    connection.fail(TimeoutError(f"no answer within {timeout:.1f}s"))


class Http1Pool:
    """Idle keep-alive connections per (host, port), made on and used from one event loop."""

    MAX_TARGETS = 256  # parsed URLs kept (a rollout asks a handful: the router's and each engine's)

    def __init__(self) -> None:
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
        body: bytes | None,
        *,
        timeout: float,
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Answer:
        """Send one request on an idle connection (or a new one) and read its whole answer, within
        `timeout` seconds from the call (`TimeoutError` after it); `NotConnected`, `ConnectionDropped`
        or `AnswerCut` when the connection fails, which is then closed, as on a timeout or cancellation."""
        if self.closed:
            raise RuntimeError("this Http1Pool is closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        key = (target.host, target.port)
        idle = self._idle.get(key)
        connection = None
        while idle:
            candidate = idle.pop()
            if not candidate.closed:
                connection = candidate
                break
        if connection is None:
            connection = await self._connect(loop, target, timeout)
        head = [b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (method.encode(), target.path, target.authority)]
        if headers:
            head.extend(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())
        if body is not None:
            head.append(b"Content-Type: %s\r\nContent-Length: %d\r\n" % (content_type.encode(), len(body)))
        head.append(b"\r\n")
        if body:
            head.append(body)
        self._busy.add(connection)
        timer = loop.call_at(deadline, _expire, connection, timeout)
        try:
            answer = await connection.send(b"".join(head), loop)
        except BaseException:  # failed, timed out or cancelled: never reused, so the server sees us leave
            connection.fail(ConnectionDropped("the request was abandoned"))
            raise
        finally:
            timer.cancel()
            self._busy.discard(connection)
            connection.waiter = None
        if connection.reusable and not self.closed:
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
