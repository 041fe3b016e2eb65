"""`Http1Pool`, the keep-alive HTTP/1.1 client of `request_json`, against servers that answer every way HTTP/1.1
allows and fail every way a connection can: a raw asyncio server writes exactly the bytes each test scripts (and
sees when the client leaves), and uvicorn and aiohttp's server are the real peers. A connection is reused only
after a whole answer that allows it; any failure, deadline or cancellation closes it, so the server sees the
client leave (which is how SGLang and sglang-router learn to abort a request)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime.testing.local_http import serve_app
from slime.testing.until import until_async
from slime.utils.http1_pool import AnswerCut, ConnectionDropped, Http1Pool, NotConnected, parse_target
from slime.utils.http_retry import HttpError, RetryPolicy, request_json
from slime.utils.misc import find_free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "RawServer"], Awaitable[None]]


class RawServer:
    """Runs `handler(reader, writer, server)` per connection; counts connections and the ones the client closed."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.client_left = asyncio.Event()  # a connection's reader saw EOF (the client closed it)
        self.requests: list[bytes] = []

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        """One whole request (head and Content-Length body), or None at EOF."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            self.client_left.set()
            return None
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request

    async def wait_for_eof(self, reader: asyncio.StreamReader) -> None:
        await reader.read()
        self.client_left.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.client_left.set()
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[tuple[str, RawServer]]:
    server = RawServer(handler)
    listening = await asyncio.start_server(server._serve, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        listening.close()


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status}\r\n{head}\r\n".encode() + body


def json_answer(obj) -> bytes:
    body = json.dumps(obj).encode()
    return answer(body, "Content-Type: application/json", f"Content-Length: {len(body)}")


async def keep_answering(reader, writer, server: RawServer) -> None:
    """Answers each request on the connection with its own request line, with a length, kept alive."""
    while (request := await server.read_request(reader)) is not None:
        writer.write(json_answer({"line": request.split(b"\r\n")[0].decode(), "n": len(server.requests)}))
        await writer.drain()


async def ask(pool: Http1Pool, url: str, body: bytes | None = b"{}", *, timeout: float = 10, method: str = "POST"):
    return await pool.request(method, pool.target(url), body, timeout=timeout)


# ---- answers read whole, however they are framed and however the bytes arrive ---------------------------
def chunked(body: bytes, cuts: list[int]) -> bytes:
    edges = sorted({0, len(body), *(c for c in cuts if 0 < c < len(body))})
    parts = [body[a:b] for a, b in zip(edges, edges[1:])]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.binary(max_size=3000),
    framing=st.sampled_from(["length", "chunked", "close"]),
    cuts=st.lists(st.integers(0, 3200), max_size=6),
    writes=st.lists(st.integers(1, 4000), min_size=1, max_size=8),
)
def test_an_answer_is_read_whole_whatever_its_framing_and_wherever_its_bytes_are_split(body, framing, cuts, writes):
    if framing == "length":
        raw = answer(body, f"Content-Length: {len(body)}")
    elif framing == "chunked":
        raw = answer(chunked(body, cuts), "Transfer-Encoding: chunked")
    else:  # neither a length nor chunks: the answer ends with its connection
        raw = answer(body, "Connection: close")

    async def handler(reader, writer, server):
        await server.read_request(reader)
        at = 0
        for size in writes + [len(raw)]:  # the answer in pieces, each flushed on its own
            writer.write(raw[at : at + size])
            await writer.drain()
            at += size
        if framing == "close":
            writer.close()
        else:
            await server.wait_for_eof(reader)

    async def go():
        async with raw_server(handler) as (url, _):
            pool = Http1Pool()
            got = await ask(pool, url)
            await pool.close()
            return got

    got = asyncio.run(go())
    assert (got.status, got.body) == (200, body)


async def test_a_204_has_no_body_and_the_connection_is_reused():
    async def handler(reader, writer, server):
        while await server.read_request(reader) is not None:
            writer.write(answer(b"", status="204 No Content"))

    async with raw_server(handler) as (url, server):
        pool = Http1Pool()
        for _ in range(3):
            got = await ask(pool, url)
            assert (got.status, got.body) == (204, b"")
        await pool.close()
    assert server.connections == 1


# ---- keep-alive: reused after a whole answer that allows it, never after one that does not ----------------
async def test_sequential_requests_share_one_connection_and_concurrent_ones_get_their_own():
    async with raw_server(keep_answering) as (url, server):
        pool = Http1Pool()
        for i in range(5):
            got = await ask(pool, f"{url}/generate?x={i}")
            assert json.loads(got.body)["line"] == f"POST /generate?x={i} HTTP/1.1"
        assert server.connections == 1
        await asyncio.gather(*(ask(pool, url) for _ in range(4)))
        assert server.connections == 4  # the idle one and three new ones
        await asyncio.gather(*(ask(pool, url) for _ in range(4)))
        assert server.connections == 4  # all four were kept
        await pool.close()
        await asyncio.wait_for(server.client_left.wait(), 10)


async def test_an_answer_that_closes_its_connection_is_not_reused():
    async def handler(reader, writer, server):
        await server.read_request(reader)
        writer.write(answer(b"{}", "Content-Length: 2", "Connection: close"))

    async with raw_server(handler) as (url, server):
        pool = Http1Pool()
        for _ in range(3):
            assert (await ask(pool, url)).body == b"{}"
        await pool.close()
    assert server.connections == 3


async def test_an_idle_connection_the_server_closed_is_not_used_again():
    async def handler(reader, writer, server):  # one answer, then the server closes (uvicorn's keep-alive timeout)
        await server.read_request(reader)
        writer.write(json_answer({}))
        await writer.drain()

    async with raw_server(handler) as (url, server):
        pool = Http1Pool()
        await ask(pool, url)
        (idle,) = pool._idle[("127.0.0.1", pool.target(url).port)]
        await asyncio.wait_for(until_async(lambda: idle.closed), 10)  # the server's FIN reaches this loop
        assert (await ask(pool, url)).status == 200
        await pool.close()
    assert server.connections == 2


@pytest.mark.parametrize("when", ["with-the-answer", "while-idle"])
async def test_a_connection_the_server_writes_more_to_is_closed_not_reused(when):
    answered = asyncio.Event()

    async def handler(reader, writer, server):  # an answer, then unasked bytes (a 408 some servers send), open
        while await server.read_request(reader) is not None:
            writer.write(json_answer({}))
            if server.connections == 1:
                if when == "while-idle":
                    await writer.drain()
                    await answered.wait()  # the client has its answer and the connection is idle
                writer.write(answer(b"", "Content-Length: 0", status="408 Request Timeout"))

    async with raw_server(handler) as (url, server):
        pool = Http1Pool()
        await ask(pool, url)
        answered.set()
        # the unasked bytes came with the answer (never back in the pool) or after it (closed once they came)
        idle = pool._idle.get(("127.0.0.1", pool.target(url).port), [])
        await asyncio.wait_for(until_async(lambda: all(c.closed for c in idle)), 10)
        assert json.loads((await ask(pool, url)).body) == {} and server.connections == 2
        await pool.close()


async def test_a_connection_idle_longer_than_keep_idle_is_closed_not_reused():
    async with raw_server(keep_answering) as (url, server):
        pool = Http1Pool(keep_idle=0.0)  # every idle connection is too old by the next request
        for _ in range(3):
            assert (await ask(pool, url)).status == 200
        await asyncio.wait_for(server.client_left.wait(), 10)  # the pool closed the old ones itself
        await pool.close()
    assert server.connections == 3 and Http1Pool().keep_idle < 5.0  # uvicorn's keep-alive timeout


# ---- failures say how far the request got, and the connection is closed --------------------------------
async def test_a_port_nobody_listens_on_is_not_connected():
    pool = Http1Pool()
    with pytest.raises(NotConnected, match="cannot connect"):
        await ask(pool, f"http://127.0.0.1:{find_free_port()}/generate")
    await pool.close()


async def test_a_connection_closed_before_any_answer_is_dropped():
    async def handler(reader, writer, server):
        await server.read_request(reader)  # read, then close without a word

    async with raw_server(handler) as (url, _):
        pool = Http1Pool()
        with pytest.raises(ConnectionDropped):
            await ask(pool, url)
        await pool.close()


@pytest.mark.parametrize(
    "raw",
    [
        answer(b'{"ok": tr', "Content-Length: 20"),  # a length not reached
        answer(b"5\r\nhello\r\n", "Transfer-Encoding: chunked"),  # chunks without their end
        b"HTTP/1.1 200 OK\r\nContent-Le",  # the head itself cut
        b"HTTP/1.1 200 OK\r\nX-A: 1\r\n",  # whole headers, not the blank line that ends them
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",  # not HTTP at all
    ],
    ids=["length", "chunked", "head", "headers", "not-http"],
)
async def test_an_answer_cut_or_broken_is_cut_and_its_connection_closed(raw):
    async def handler(reader, writer, server):
        await server.read_request(reader)
        writer.write(raw)
        await writer.drain()
        if raw.startswith(b"SSH"):
            await server.wait_for_eof(reader)  # the client must leave on its own

    async with raw_server(handler) as (url, server):
        pool = Http1Pool()
        with pytest.raises(AnswerCut):
            await ask(pool, url)
        assert not any(pool._idle.values())
        await pool.close()
        if raw.startswith(b"SSH"):
            await asyncio.wait_for(server.client_left.wait(), 10)


async def test_a_deadline_or_a_cancellation_closes_the_connection_so_the_server_sees_the_client_leave():
    hold = asyncio.Event()

    async def handler(reader, writer, server):
        await server.read_request(reader)
        await server.wait_for_eof(reader)  # never answers; returns when the client closes
        hold.set()

    async with raw_server(handler) as (url, server):
        pool = Http1Pool()
        with pytest.raises(TimeoutError, match="no answer within 0.2s"):
            await ask(pool, url, timeout=0.2)
        await asyncio.wait_for(hold.wait(), 10)
        hold.clear()
        server.client_left.clear()
        pending = asyncio.ensure_future(ask(pool, url))
        await asyncio.wait_for(until_async(lambda: len(server.requests) == 2), 10)
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        await asyncio.wait_for(hold.wait(), 10)
        assert server.connections == 2 and not any(pool._idle.values())
        await pool.close()


async def test_closing_the_pool_fails_a_request_in_flight_and_closes_idle_connections():
    async def handler(reader, writer, server):  # answers the first request only
        while await server.read_request(reader) is not None:
            if len(server.requests) > 1:
                await server.wait_for_eof(reader)
                return
            writer.write(json_answer({}))

    async with raw_server(handler) as (url, server):
        pool = Http1Pool()
        await ask(pool, url)  # one idle connection
        busy = asyncio.ensure_future(ask(pool, url))
        await asyncio.wait_for(until_async(lambda: len(server.requests) == 2), 10)
        await pool.close()
        with pytest.raises(ConnectionDropped, match="closed"):
            await busy
        with pytest.raises(RuntimeError, match="closed"):
            await ask(pool, url)
        await asyncio.wait_for(server.client_left.wait(), 10)


# ---- the request on the wire ------------------------------------------------------------------------
async def test_the_request_carries_its_host_headers_and_body_and_a_get_has_no_body():
    async with raw_server(keep_answering) as (url, server):
        pool = Http1Pool()
        target = pool.target(f"{url}/generate")
        await pool.request("POST", target, b'{"a": 1}', timeout=10, headers={"X-SMG-Routing-Key": "s-1"})
        await pool.request("GET", pool.target(f"{url}/workers"), None, timeout=10)
        await pool.close()
    post, get = server.requests
    assert post.split(b"\r\n")[0] == b"POST /generate HTTP/1.1"
    assert f"Host: 127.0.0.1:{target.port}".encode() in post and b"X-SMG-Routing-Key: s-1" in post
    assert b"Content-Type: application/json" in post and post.endswith(b'\r\n\r\n{"a": 1}')
    assert get.startswith(b"GET /workers HTTP/1.1\r\n") and b"Content-Length" not in get


async def test_no_header_or_url_can_split_the_request_and_the_callers_content_type_is_the_only_one():
    async with raw_server(keep_answering) as (url, server):
        pool = Http1Pool()
        for bad in ({"X-SMG-Routing-Key": "s\r\nX-Evil: 1"}, {"X-A\nB": "v"}, {"X": "a\x00b"}):
            with pytest.raises(ValueError, match="not allowed in a header"):
                await pool.request("POST", pool.target(url), b"{}", timeout=10, headers=bad)
        assert server.requests == []  # nothing was sent
        target = pool.target(f"{url}/a b/\r\nX-Evil: 1?q=x y")
        await pool.request("POST", target, b"x", timeout=10, headers={"content-type": "text/plain"})
        await pool.close()
    (request,) = server.requests
    head = request.split(b"\r\n\r\n")[0].split(b"\r\n")
    # CR and LF dropped by urlsplit (as WHATWG URL parsing does), a space percent-encoded: one request line
    assert head[0] == b"POST /a%20b/X-Evil:%201?q=x%20y HTTP/1.1"
    assert [h for h in head if h.lower().startswith(b"content-type")] == [b"content-type: text/plain"]
    assert not any(h.startswith(b"X-Evil") for h in head)


def test_only_plain_http_urls_are_taken():
    t = parse_target("http://[::1]:8080/v1/x?y=1")
    assert (t.host, t.port, t.authority, t.path) == ("::1", 8080, b"[::1]:8080", b"/v1/x?y=1")
    assert parse_target("http://example.com").port == 80 and parse_target("http://example.com").path == b"/"
    assert parse_target("https://example.com/generate") is None and parse_target("unix:///tmp/s") is None


# ---- request_json over the pool, against the real servers --------------------------------------------
async def test_request_json_through_the_pool_against_aiohttp_and_uvicorn():
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    calls = {"n": 0}

    async def flaky(request):
        calls["n"] += 1
        if calls["n"] == 1:
            return PlainTextResponse("busy", status_code=503, headers={"Retry-After": "0"})
        return JSONResponse({"got": await request.json()})

    async def missing(request):
        return PlainTextResponse("no such thing", status_code=404)

    app = Starlette(routes=[Route("/flaky", flaky, methods=["POST"]), Route("/missing", missing, methods=["POST"])])
    port = find_free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"echo": await request.json()})

    pool = Http1Pool()
    try:
        fast = RetryPolicy(max_retries=2, base_delay=0.01, max_delay=0.02)
        uv = f"http://127.0.0.1:{port}"
        got = await request_json("POST", f"{uv}/flaky", {"x": [1, 2]}, timeout=10, policy=fast, session=pool)
        assert got == {"got": {"x": [1, 2]}} and calls["n"] == 2
        with pytest.raises(HttpError) as missing_error:
            await request_json("POST", f"{uv}/missing", {}, timeout=10, session=pool)
        assert (missing_error.value.status, missing_error.value.body) == (404, "no such thing")
        async with serve_app({"/echo": echo}) as aio:
            for i in range(3):
                assert await request_json("POST", f"{aio}/echo", {"i": i}, timeout=10, session=pool) == {
                    "echo": {"i": i}
                }
    finally:
        await pool.close()
        server.should_exit = True
        await serving


async def test_a_url_the_pool_cannot_send_goes_through_aiohttp_and_its_failure_is_classified_like_the_pools():
    """`https://` to a server that closes every connection at once: the pool refuses the URL, a one-off aiohttp
    session tries it, the TLS handshake is cut, and `request_json` counts a connection failure (aiohttp's
    error translated to the pool's), not an unknown error."""

    async def close_at_once(reader, writer, server):
        return

    async with raw_server(close_at_once) as (url, server):
        pool = Http1Pool()
        with pytest.raises(HttpError) as failed:
            https = url.replace("http://", "https://")
            await request_json("POST", https, {}, timeout=5, policy=RetryPolicy(max_retries=0), session=pool)
        await pool.close()
    assert failed.value.reason == "connection" and server.connections == 1
    assert "cause: connection: NotConnected: ClientConnectorError: Cannot connect to host" in str(failed.value)
