"""`run_app_in_thread`: serve an aiohttp application from a daemon thread (slime's API).

The rollout function's event loop stays free while agent CLIs call the adapter; the call
returns once the socket listens, with the port bound (port 0 picks a free one). Binds 127.0.0.1
unless told otherwise: a sandbox that must reach it gets the address explicitly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from typing import Any

from aiohttp import web
from aiohttp.web_log import AccessLogger

logger = logging.getLogger(__name__)
STOP_TIMEOUT = 10.0  # seconds `AppHandle.stop` waits for the runner's cleanup


class FilteredAccessLogger(AccessLogger):
    """Logs only failed or slow requests (an agent makes thousands of good ones)."""

    SLOW_THRESHOLD_SEC = 120.0

    def log(self, request, response, time):
        if request.method == "HEAD" or (response.status == 200 and time <= self.SLOW_THRESHOLD_SEC):
            return
        super().log(request, response, time)


@dataclasses.dataclass
class AppHandle:
    host: str
    port: int
    thread: threading.Thread
    loop: asyncio.AbstractEventLoop
    runner: web.AppRunner

    def stop(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=STOP_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - the loop stops below either way; say why cleanup did not finish
            logger.warning("app on port %d: cleanup failed: %r", self.port, e)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=STOP_TIMEOUT)


def run_app_in_thread(
    app: web.Application,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    thread_name: str = "aiohttp-app",
    start_timeout_sec: float = 15.0,
    runner_kwargs: dict[str, Any] | None = None,
) -> AppHandle:
    """Start `app` on a daemon thread and return once it listens (`runner_kwargs` go to `AppRunner`)."""
    started = threading.Event()
    box: dict[str, Any] = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            runner = web.AppRunner(app, **(runner_kwargs or {}))
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, host, port)
            loop.run_until_complete(site.start())
            box.update(loop=loop, runner=runner, port=runner.addresses[0][1])
        except BaseException as e:  # noqa: BLE001 - handed to the starting thread, which raises it
            box["error"] = e
            return
        finally:
            started.set()
        loop.run_forever()
        loop.close()

    thread = threading.Thread(target=serve, name=thread_name, daemon=True)
    thread.start()
    if not started.wait(start_timeout_sec):
        raise RuntimeError(f"{thread_name}: the app did not listen on {host}:{port} within {start_timeout_sec}s")
    if "error" in box:
        raise box["error"]
    return AppHandle(host=host, port=int(box["port"]), thread=thread, loop=box["loop"], runner=box["runner"])
