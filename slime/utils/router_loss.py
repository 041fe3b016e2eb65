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
from typing import Any


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
        self._waiting: dict[str, set[_Watch]] = {}

    def lost(self, url: str, why: str) -> None:
        """The router at `url` is gone: every attempt on it fails now with `why` (and any later one at once)."""
        base = _base(url)
        with self._lock:
            self._gone[base] = why
            waiting = self._waiting.pop(base, set())
        for watch in waiting:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nothing waits there any more
                watch.loop.call_soon_threadsafe(watch.cut, why)

    def serving(self, url: str) -> None:
        """A router serves at `url` (again: a new one may get a lost one's address)."""
        with self._lock:
            self._gone.pop(_base(url), None)

    def watch(self, url: str) -> "_Watch":
        """`async with watch(url):` runs the block (one request attempt to `url`) and raises RouterLost as
        soon as that address is gone."""
        return _Watch(self, _base(url))


class _Watch:
    """One watched attempt. A plain class, not a generator-based context manager with a future of its own:
    every engine request passes through one, so its cost is on every sample (bench_rollout_overhead)."""

    __slots__ = ("losses", "base", "loop", "task", "why", "inside")

    def __init__(self, losses: RouterLosses, base: str) -> None:
        self.losses, self.base, self.why, self.inside = losses, base, None, False

    async def __aenter__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        losses = self.losses
        with losses._lock:
            why = losses._gone.get(self.base)
            if why is None:
                self.inside = True
                losses._waiting.setdefault(self.base, set()).add(self)
        if why is not None:
            raise RouterLost(f"router at {self.base} is gone: {why}")

    def cut(self, why: str) -> None:
        """On the attempt's loop: the task is suspended inside the block, where it is cancelled."""
        if self.inside and self.why is None:
            self.why = why
            self.task.cancel()

    async def __aexit__(self, kind: Any, error: Any, tb: Any) -> bool:
        self.inside = False
        losses = self.losses
        with losses._lock:
            waiting = losses._waiting.get(self.base)
            if waiting is not None:
                waiting.discard(self)
        if kind is asyncio.CancelledError and self.why is not None and self.task.uncancel() == 0:
            raise RouterLost(f"router at {self.base} is gone: {self.why}") from None  # cancelled by `cut` only
        return False
