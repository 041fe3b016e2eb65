"""`RouterLosses`: requests in flight on a router that is gone are cut at once, not at their deadline.

A router whose node died leaves its clients' connections open on a real network (no reset comes from a
dead host): each request would wait for `--request-timeout` before its retry. The fleet knows the router
went (its host actor died) and where it serves now; it says so here (`lost(old_url, why)`, from any
thread), and every request attempt that watches that address (`watch(url)`, on its event loop) is woken
at once, fails with reason `router_lost` and is retried at the new address (slime.utils.http_retry).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator


class RouterLost(ConnectionError):
    """The router this attempt was sent to is gone (the message says why and where it serves now)."""


def _base(url: str) -> str:
    """`http://host:port` of a URL (a router's address, which its request URLs extend)."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


class RouterLosses:
    """Router addresses known gone, and the request attempts waiting on each address."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gone: dict[str, str] = {}  # address -> why it is gone
        self._waiting: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Future]]] = {}

    def lost(self, url: str, why: str) -> None:
        """The router at `url` is gone: every attempt on it fails now with `why` (and any later one at once)."""
        base = _base(url)
        with self._lock:
            self._gone[base] = why
            waiting = self._waiting.pop(base, set())
        for loop, notice in waiting:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nothing waits there any more
                loop.call_soon_threadsafe(_settle, notice, why)

    def serving(self, url: str) -> None:
        """A router serves at `url` (again: a new one may get a lost one's address)."""
        with self._lock:
            self._gone.pop(_base(url), None)

    @contextlib.asynccontextmanager
    async def watch(self, url: str) -> AsyncIterator[None]:
        """Run the block (one request attempt to `url`); raise RouterLost as soon as that address is gone."""
        base = _base(url)
        loop = asyncio.get_running_loop()
        notice: asyncio.Future = loop.create_future()
        with self._lock:
            why = self._gone.get(base)
            if why is None:
                self._waiting.setdefault(base, set()).add((loop, notice))
        if why is not None:
            raise RouterLost(f"router at {base} is gone: {why}")
        task = asyncio.current_task()
        inside = [True]

        def cut(_: asyncio.Future) -> None:
            if inside[0]:  # runs on this loop: the task is suspended inside the block, where it is cancelled
                task.cancel()

        notice.add_done_callback(cut)
        try:
            yield
        except asyncio.CancelledError:
            if notice.done() and task.uncancel() == 0:  # cancelled by `cut` only
                raise RouterLost(f"router at {base} is gone: {notice.result()}") from None
            raise
        finally:
            inside[0] = False
            notice.remove_done_callback(cut)
            with self._lock:
                self._waiting.get(base, set()).discard((loop, notice))


def _settle(notice: asyncio.Future, why: str) -> None:
    if not notice.done():
        notice.set_result(why)
