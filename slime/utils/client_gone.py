"""`client_gone(request)`: returns when the HTTP client of a request closed its connection.

An engine stops working on a request whose client went away, as SGLang does (its tokenizer manager
aborts a non-streaming request whose connection closed). This is what makes an abandoned request
cost nothing to abort through a router: the router closes its connection to the engine that had
the request when our client closes its own (sglang-router 0.3.2 does), so the abort reaches
exactly that engine without anyone knowing which one it was.
"""

from __future__ import annotations

from starlette.requests import Request


async def client_gone(request: Request) -> None:
    """Wait for the ASGI `http.disconnect` message (an event from the server, not a poll). Call it
    once the body has been read: every further `receive` waits until the connection closes."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
