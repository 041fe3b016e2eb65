"""One background event loop per process, so sync entry points (slime's
`generate_rollout(args, rollout_id, data_source)`) can run async code and keep the HTTP
connection pool alive across rollouts."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def get_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="slime-async", daemon=True).start()
        return _loop


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run `coro` on the background loop and wait for its result (slime's `async_utils.run`)."""
    return asyncio.run_coroutine_threadsafe(coro, get_loop()).result()
