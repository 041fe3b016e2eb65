"""`PerLoop`: one object per event loop, for asyncio things bound to the loop that made them.

An HTTP session or a semaphore made on one loop cannot be used on another, and sync entry points
may run coroutines on several loops over a process's life. The cache is keyed by the loop object
itself, weakly (never by `id(loop)`: a new loop can reuse a dead loop's id), and the last loop's
value is kept on a fast path, so the per-request cost is one weak-reference call.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")
logger = logging.getLogger(__name__)


class PerLoop(Generic[T]):
    def __init__(self, make: Callable[[], T], usable: Callable[[T], bool] | None = None):
        """`make()` builds the value for the running loop; `usable(value)` False (e.g. a closed
        session) makes a new one."""
        self._make, self._usable = make, usable
        self._by_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T]" = weakref.WeakKeyDictionary()
        self._last: tuple[weakref.ref, T] | None = None  # (the loop, its value): one attribute, read atomically

    def get(self) -> T:
        """The running loop's value (made on first use)."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0]() is loop and (self._usable is None or self._usable(last[1])):
            return last[1]
        value = self._by_loop.get(loop)
        if value is None or (self._usable is not None and not self._usable(value)):
            value = self._by_loop[loop] = self._make()
        self._last = (weakref.ref(loop), value)
        return value

    def pop(self) -> T | None:
        """Forget the running loop's value and return it (None when it has none)."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0]() is loop:
            self._last = None
        return self._by_loop.pop(loop, None)

    def drain(self) -> list[tuple[asyncio.AbstractEventLoop, T]]:
        """Forget every loop's value and return them with their loops (for an owner closing them all)."""
        self._last = None
        items = list(self._by_loop.items())
        self._by_loop.clear()
        return items


async def close_on_their_loops(
    items: list[tuple[asyncio.AbstractEventLoop, T]], close: Callable[[T], Any], timeout: float
) -> int:
    """Close each value of `PerLoop.drain()` on the loop that made it (`close(value)` is a coroutine):
    the running loop's here, another running loop's on that loop (waiting at most `timeout` seconds,
    then a warning). A value of a loop that no longer runs cannot be closed: returns how many were left."""
    here = asyncio.get_running_loop()
    ended = 0
    for loop, value in items:
        if not loop.is_running():
            ended += 1
        elif loop is here:
            await close(value)
        else:
            closing = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(close(value), loop))
            try:
                await asyncio.wait_for(closing, timeout)
            except asyncio.TimeoutError:
                logger.warning("a client on another event loop did not close within %.0fs", timeout)
    return ended
