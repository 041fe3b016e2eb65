"""`ThreadedServer`: a uvicorn server on a daemon thread of the test's own process, for the in-process
fakes (scripted engine, retriever). Its socket is bound when it is made (port 0: the OS picks one,
`port` says which), so no other process can take the port between picking it and serving on it, as a
port found free and bound later can be (two test workers, each starting servers). `start` returns once
the server listens (an event set by its startup, no polling) or raises after `timeout`; `stop` asks it
to exit and joins the thread."""

from __future__ import annotations

import socket
import threading
from typing import Any

import uvicorn

from slime.utils.http1_server import Http1Only

_STOP_JOIN_SECONDS = 10


class ThreadedServer:
    def __init__(self, app: Any, host: str, port: int = 0, *, what: str, thread_name: str | None = None):
        """`what` names the server in the start-up error, e.g. "retriever" (its `url` follows)."""
        self.what = what
        self.socket = socket.create_server((host, port))
        self.port = self.socket.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self._server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=self.port, log_level="warning", lifespan="off", http=Http1Only)
        )
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self.socket]}, daemon=True, name=thread_name
        )

    def start(self, timeout: float) -> None:
        started = threading.Event()
        orig = self._server.startup

        async def startup(*a: Any, **kw: Any) -> None:
            await orig(*a, **kw)
            started.set()

        self._server.startup = startup
        self._thread.start()
        if not started.wait(timeout):
            raise RuntimeError(f"{self.what} at {self.url} did not start within {timeout}s")

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=_STOP_JOIN_SECONDS)
        self.socket.close()  # (the server closed it on exit; a server never started still holds it)
