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
    """Router addresses known gone, and the request attempts waiting on each address.

    Written from any thread (`lost`, `serving`: under `_lock`), read on the request's loop without the
    lock (`_Watch`: every engine request passes through one, so its cost is on every sample). Why that is
    safe in CPython: each read or write below is one dict/set operation, atomic under the GIL (str keys,
    identity-hashed watches: no Python code runs inside them). A watch adds itself to its address's set
    and then reads `_gone`; `lost` writes `_gone` and then pops the set. So either the watch reads the
    loss (and raises) or its add came before the write, hence before the pop, into the set popped (a set
    leaves `_waiting` only by that pop; one fetched before an earlier pop means that earlier loss was
    written first, and the watch reads it, unless `serving` already declared the address live again, when
    nothing is left to cut). `lost` iterates a copy of the popped set, so a watch leaving at that moment
    (`discard`) does not change the set under its iteration.
    """

    # request URLs whose address is kept (`_bases`): the router's /generate and a fleet's engines, a few;
    # past this many (a plugin sending to ever-new URLs) the cache starts over
    MAX_BASES = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()  # between writers (`lost`, `serving`); readers take none (see above)
        self._gone: dict[str, str] = {}  # address -> why it is gone
        self._waiting: dict[str, set[_Watch]] = {}
        self._bases: dict[str, str] = {}  # request URL -> its address (`_base`), computed once per URL

    def lost(self, url: str, why: str) -> None:
        """The router at `url` is gone: every attempt on it fails now with `why` (and any later one at once)."""
        base = _base(url)
        with self._lock:
            self._gone[base] = why
            waiting = self._waiting.pop(base, None)
        for watch in waiting.copy() if waiting else ():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nothing waits there any more
                watch.task.get_loop().call_soon_threadsafe(watch.cut, why)

    def serving(self, url: str) -> None:
        """A router serves at `url` (again: a new one may get a lost one's address)."""
        with self._lock:
            self._gone.pop(_base(url), None)

    def watch(self, url: str) -> "_Watch":
        """`with watch(url):` (or `async with`), inside a task, runs the block (one request attempt to `url`)
        and raises RouterLost as soon as that address is gone."""
        base = self._bases.get(url)
        if base is None:
            if len(self._bases) >= self.MAX_BASES:
                self._bases.clear()
            base = self._bases[url] = _base(url)
        return _Watch(self, base)


class _Watch:
    """One watched attempt. A plain class, not a generator-based context manager with a future of its own,
    and entered with `with` (`async with` too): nothing in it awaits, and every engine request passes through
    one, so two coroutines per attempt would be on every sample (bench_rollout_overhead)."""

    __slots__ = ("losses", "base", "task", "why", "inside", "waiting")

    def __init__(self, losses: RouterLosses, base: str) -> None:
        self.losses, self.base, self.why, self.inside = losses, base, None, False

    def __enter__(self) -> None:
        self.task = asyncio.current_task()
        losses, base = self.losses, self.base
        waiting = losses._waiting.get(base)
        if waiting is None:
            waiting = losses._waiting.setdefault(base, set())
        self.waiting, self.inside = waiting, True
        waiting.add(self)
        why = losses._gone.get(base)  # read after the add: see `RouterLosses`
        if why is not None:
            self.inside = False
            waiting.discard(self)
            raise RouterLost(f"router at {base} is gone: {why}")

    def cut(self, why: str) -> None:
        """On the attempt's loop: the task is suspended inside the block, where it is cancelled."""
        if self.inside and self.why is None:
            self.why = why
            self.task.cancel()

    def __exit__(self, kind: Any, error: Any, tb: Any) -> bool:
        self.inside = False
        self.waiting.discard(self)  # the set it joined: the address's, or one `lost` popped (then dropped)
        if kind is asyncio.CancelledError and self.why is not None and self.task.uncancel() == 0:
            raise RouterLost(f"router at {self.base} is gone: {self.why}") from None  # cancelled by `cut` only
        return False

    async def __aenter__(self) -> None:
        self.__enter__()

    async def __aexit__(self, kind: Any, error: Any, tb: Any) -> bool:
        return self.__exit__(kind, error, tb)
