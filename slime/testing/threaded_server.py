"""`ThreadedServer`: a uvicorn server on a daemon thread of the test's own process, for the in-process
fakes (scripted engine, retriever). `start` returns once the server listens (an event set by its
startup, no polling) or raises after `timeout`; `stop` asks it to exit and joins the thread."""

from __future__ import annotations

import threading
from typing import Any

import uvicorn

from slime.utils.http1_server import Http1Only

_STOP_JOIN_SECONDS = 10


class ThreadedServer:
    def __init__(self, app: Any, host: str, port: int, *, what: str, thread_name: str | None = None):
        """`what` names the server in the start-up error, e.g. "retriever at http://127.0.0.1:8000"."""
        self.what = what
        self._server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off", http=Http1Only)
        )
        self._thread = threading.Thread(target=self._server.run, daemon=True, name=thread_name)

    def start(self, timeout: float) -> None:
        started = threading.Event()
        orig = self._server.startup

        async def startup(*a: Any, **kw: Any) -> None:
            await orig(*a, **kw)
            started.set()

        self._server.startup = startup
        self._thread.start()
        if not started.wait(timeout):
            raise RuntimeError(f"{self.what} did not start within {timeout}s")

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=_STOP_JOIN_SECONDS)
