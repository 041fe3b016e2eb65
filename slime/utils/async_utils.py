"""One background event loop per process, so sync entry points (slime's
`generate_rollout(args, rollout_id, data_source)`) can run async code and keep the HTTP
connection pool alive across rollouts.

`run(coro)` can be watched: inside `with watched(watch):` (a context variable of the calling
thread, set by whoever calls the rollout function), `run` returns as soon as either the coroutine
finishes or `watch.tripped` (a `concurrent.futures.Future`) is given an exception; then the
coroutine is cancelled and that exception raised. This is how a rollout function that cannot
make progress is failed from outside, without polling and without knowing the function.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Coroutine, Iterator, Protocol

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


class Watch(Protocol):
    tripped: concurrent.futures.Future  # set_exception(...) fails the watched `run`


_watch: ContextVar[Watch | None] = ContextVar("slime_async_utils_watch", default=None)


class AsyncLoopThread:
    """slime's handle on a background loop: `.loop` and `.run(coro)`. `AsyncLoopThread()` starts a
    new loop in its own daemon thread; `get_async_loop()` wraps the process's shared one."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        if loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="slime-async-extra", daemon=True).start()
        self.loop = loop

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


def get_async_loop() -> AsyncLoopThread:
    """slime's name for the process's background loop (the one `run` uses)."""
    return AsyncLoopThread(get_loop())


def get_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="slime-async", daemon=True).start()
        return _loop


@contextmanager
def watched(watch: Watch) -> Iterator[Watch]:
    """`run` calls made by this thread inside the block end early when `watch` trips."""
    token = _watch.set(watch)
    try:
        yield watch
    finally:
        _watch.reset(token)


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run `coro` on the background loop and wait for its result (slime's `async_utils.run`)."""
    future = asyncio.run_coroutine_threadsafe(coro, get_loop())
    watch = _watch.get()
    if watch is None:
        return future.result()
    concurrent.futures.wait([future, watch.tripped], return_when=concurrent.futures.FIRST_COMPLETED)
    if future.done() or not watch.tripped.done():
        return future.result()
    future.cancel()  # the coroutine gets CancelledError on its loop
    error = watch.tripped.exception()
    if error is None:
        raise RuntimeError("async_utils.run: the watch tripped without an error")
    raise error
