"""`serve_app`: a throwaway aiohttp app on 127.0.0.1 (a free port) for tests that need a real HTTP peer."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serve_app(posts: dict[str, Handler]) -> AsyncIterator[str]:
    """Serve POST `path -> handler` for the duration of the block; yields the base URL (no trailing /)."""
    app = web.Application()
    for path, handler in posts.items():
        app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()
