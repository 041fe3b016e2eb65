"""``POST /run_code`` at the ASGI level: admitted before its body is read, the body bounded in size,
time and number in memory, and the run cancelled when its client goes away.

Why not a FastAPI route: a run's fixed cost is what the sandbox's throughput is made of (no
routing, no Request object, no response class), and a route sees the body only once it is whole.
Order per request: ``Content-Length`` over the limit: 413; no room in the queue: 429 (nothing read);
then, among at most ``max_bodies`` bodies in memory at once, the body is read within
``body_timeout`` seconds (408 otherwise; 413 past the limit when it has no length) and parsed (422
naming the field); then the run, while the connection is watched: a disconnect cancels it (its
slot's processes are killed). Every other request goes to the FastAPI app.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable

Reply = tuple[int, bytes, list[tuple[bytes, bytes]]]  # HTTP status, JSON body, extra headers


def error_body(message: str, **extra: Any) -> bytes:
    return json.dumps({"status": "SandboxError", "message": message, **extra}).encode()


class RunCodeEndpoint:
    """`parse(raw)` gives the request (a dict) or its validation errors (a list: 422);
    `execute(request, ticket)` runs it once admitted; `admission` (server.py's `Admission`) holds
    the queue."""

    def __init__(
        self,
        app,
        *,
        admission,
        parse: Callable[[bytes], Awaitable[Any]],
        execute: Callable[[Any, Any], Awaitable[Reply]],
        max_body: int,
        body_timeout: float,
        max_bodies: int,
    ) -> None:
        self.app, self.adm, self.parse, self.execute = app, admission, parse, execute
        self.max_body, self.body_timeout = max_body, body_timeout
        self.bodies = asyncio.Semaphore(max_bodies)  # (bound to the server's loop on first use)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != "/run_code" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers") or []:
            if k == b"content-length" and v.isdigit() and int(v) > self.max_body:
                return await _reply(send, 413, error_body(f"request body larger than {self.max_body} bytes"))
        if not self.adm.reserve():
            ra = self.adm.retry_after()
            return await _reply(
                send,
                429,
                error_body("sandbox busy: too many queued runs", retry_after_s=round(ra, 3)),
                [(b"retry-after", str(max(1, int(ra + 0.999))).encode())],
            )
        reserved = True
        try:
            request = await self._receive(receive, send)
            if request is None:
                return  # (answered already, or the client went away)
            reserved = False
            reply = await self._run_watched(request, self.adm.try_enter(), receive)
        finally:
            if reserved:
                self.adm.unreserve()
        if reply is not None:
            await _reply(send, *reply)

    async def _receive(self, receive, send):
        """The parsed request, among at most `max_bodies` bodies in memory; else None, once the
        answer (408, 413, 422) is sent or the client is gone."""
        async with self.bodies:
            self.adm.bodies += 1
            try:
                try:
                    async with asyncio.timeout(self.body_timeout):
                        raw = await self._read(receive)
                except TimeoutError:
                    await _reply(send, 408, error_body(f"request body not received within {self.body_timeout:g}s"))
                    return None
                if raw is False:
                    await _reply(send, 413, error_body(f"request body larger than {self.max_body} bytes"))
                    return None
                if raw is True:
                    request = self.parse.too_many_keys()
                    raw = None
                else:
                    request = await self.parse(raw) if raw is not None else None
                del raw
            finally:
                self.adm.bodies -= 1
        if isinstance(request, list):  # (validation errors)
            fields = ", ".join(".".join(str(x) for x in d["loc"][1:]) or "body" for d in request)
            await _reply(send, 422, error_body(f"invalid request: {fields}", detail=request))
            return None
        return request

    async def _read(self, receive) -> bytes | None | bool:
        """The whole body; None if the client went away; False once it passes the size limit; True
        if it has more keys than the file budget allows (seen while it arrives: the rest is read
        and dropped, never kept nor parsed, so that the client gets its answer, not a reset)."""
        chunks, seen, keys, refused = [], 0, self.parse.budget(), False
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return None
            chunk = msg.get("body", b"")
            seen += len(chunk)
            if seen > self.max_body:
                return False
            if not refused:
                chunks.append(chunk)
                if await keys.over_off_loop(chunks, not msg.get("more_body")):
                    refused, chunks = True, []
            if not msg.get("more_body"):
                return True if refused else b"".join(chunks)

    async def _run_watched(self, request, ticket, receive) -> Reply | None:
        """Run it; if the client disconnects meanwhile, cancel the run (None: nobody to answer)."""
        me = asyncio.current_task()
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            me.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            return await self.execute(request, ticket)
        except asyncio.CancelledError:
            if gone:
                return None
            raise
        finally:
            watcher.cancel()


async def _reply(send, status: int, data: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})
