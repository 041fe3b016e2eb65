"""The arbiter of one limiter: permits, tickets, a token bucket and AIMD, on one asyncio loop.

Every permit is free here or held by exactly one client (in use or idle), so the cap is exact whatever
the messages do. While nobody queues, a client keeps the permits its callers release and reuses them
without asking (a lease). A caller that must queue gets a ticket, numbered in the order its demand
reached the core, and free permits go to tickets in number order: FIFO across processes. A client whose
own ticket is the queue head may give a permit one of its callers releases straight to its next caller:
the core would send it there anyway, so no round trip and no reordering. Tickets and the head only grow,
so a grant crossing such a hand-over costs only a spare permit, which the client uses or gives back.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from typing import Any

logger = logging.getLogger(__name__)


class ClientView:
    """What the core knows of one client (one event loop of one process)."""

    def __init__(self, cid: str) -> None:
        self.cid, self.held = cid, 0  # permits it holds, in use or idle
        self.grants: list[int] = []  # its tickets served since it last polled
        self.tickets: list[int] = []  # tickets given to it since it last polled
        self.mail = asyncio.Event()  # set: its long poll returns
        self.reaper: asyncio.TimerHandle | None = None  # armed while its mail is unread


class LimiterCore:
    """One limiter's state. Also its Ray actor, an async one: every method runs on one event loop."""

    def __init__(self, name: str, max_concurrency: int, rate_per_second: float | None = None,
                 burst: int | None = None, *, lease_ttl: float = 60.0, cut_cooldown: float = 1.0) -> None:
        if int(max_concurrency) < 1:
            raise ValueError(f"rate limiter {name!r}: max_concurrency must be >= 1, got {max_concurrency}")
        self.name, self.max_cap, self.lease_ttl, self.cut_cooldown = name, int(max_concurrency), lease_ttl, cut_cooldown
        self.base_rate = float(rate_per_second) if rate_per_second and rate_per_second > 0 else None
        self.burst = int(burst) if burst else math.ceil(self.base_rate or 0)
        self.factor = 1.0  # AIMD scales the cap and the rate by this
        self.tokens, self.refilled_at, self.last_cut = float(self.burst), time.monotonic(), -math.inf
        self.held = self.next_ticket = self.throttled = self.cuts = 0
        self.queue: deque[tuple[int, str]] = deque()  # unserved (ticket, client id), ascending
        self.clients: dict[str, ClientView] = {}
        self.gone: dict[str, None] = {}  # the last 10,000 clients dropped: their late messages are void
        self.modes, self.head_owner = (False, False), None  # see _dispatch
        self.token_timer: asyncio.TimerHandle | None = None

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "max_concurrency": self.max_cap, "rate_per_second": self.base_rate,
                "burst": self.burst if self.base_rate else None}

    @property
    def cap(self) -> int:
        return max(1, int(self.max_cap * self.factor))

    def push(self, cid: str, msg: dict[str, Any]) -> None:
        """Apply one batched message of a client (its keys: `RateLimiter._pump`, and `leave`)."""
        if cid in self.gone:
            return
        c = self.clients.get(cid) or self.clients.setdefault(cid, ClientView(cid))
        if msg.get("leave"):  # it closed, or its event loop did
            return self._drop(c)
        back = min(msg.get("release", 0), c.held)
        c.held, self.held = c.held - back, self.held - back
        while self.queue and self.queue[0][0] < msg.get("served_through", 0) and self.queue[0][1] == cid:
            self.queue.popleft()  # handed over by the client itself
        if dropped := set(msg.get("withdraw", ())):
            self.queue = deque(e for e in self.queue if e[0] not in dropped)
        if msg.get("throttled"):
            self.throttled += msg["throttled"]
            if time.monotonic() - self.last_cut >= self.cut_cooldown:  # multiplicative decrease
                self.last_cut, self.cuts = time.monotonic(), self.cuts + 1
                self.factor = max(1 / self.max_cap, self.factor / 2)
                self.tokens = min(self.tokens, self.burst * self.factor)
        elif msg.get("ok") and self.factor < 1.0:  # additive increase: +1 permit per `cap` successes
            self.factor = min(1.0, self.factor + msg["ok"] / (self.cap * self.max_cap))
        if msg.get("need"):
            new = range(self.next_ticket, self.next_ticket + msg["need"])
            self.next_ticket = new.stop
            self.queue.extend((t, cid) for t in new)
            c.tickets.extend(new)
            self._wake(c)
        self._dispatch()

    async def poll(self, cid: str) -> dict[str, Any]:
        """Long poll: returns once the client has news, or {"gone": True} once it was dropped (it left, or
        was reaped). Ray may run a client's calls out of order: the first one of any kind registers it."""
        if cid in self.gone:
            return {"gone": True}
        c = self.clients.get(cid) or self.clients.setdefault(cid, ClientView(cid))
        await c.mail.wait()
        c.mail.clear()
        if self.clients.get(cid) is not c:
            return {"gone": True}
        if c.reaper is not None:  # it reads its mail: alive
            c.reaper.cancel()
            c.reaper = None
        mail = {"grants": c.grants, "tickets": c.tickets, "head": self.queue[0][0] if self.queue else self.next_ticket,
                "lease": self.modes[0], "hand_over": self.modes[1]}
        c.grants, c.tickets = [], []
        return mail

    def stats(self) -> dict[str, Any]:
        return {"name": self.name, "cap": self.cap, "leased": self.held, "waiting": len(self.queue),
                "throttled_429": self.throttled, "aimd_cuts": self.cuts, "clients": len(self.clients)}

    def _dispatch(self) -> None:
        """Free permits (and tokens) to tickets in order. Tell every client of new modes: lease while
        nobody queues and no cut is being recovered from (the core must then hear of successes), hand-over
        unless above a cut cap; neither with a rate (every start takes a token from here). And tell the
        owner of a new queue head, which may now hand the permits its callers release to its tickets."""
        if self.base_rate is not None:
            now, rate = time.monotonic(), self.base_rate * self.factor
            self.tokens = min(float(self.burst), self.tokens + (now - self.refilled_at) * rate)
            self.refilled_at = now
        while self.queue and self.held < self.cap:
            if self.base_rate is not None and self.tokens < 1:
                if self.token_timer is not None:
                    self.token_timer.cancel()
                self.token_timer = asyncio.get_running_loop().call_later((1 - self.tokens) / rate, self._dispatch)
                break
            ticket, cid = self.queue.popleft()
            c = self.clients[cid]
            c.held, self.held = c.held + 1, self.held + 1
            if self.base_rate is not None:
                self.tokens -= 1
            c.grants.append(ticket)
            self._wake(c)
        no_rate = self.base_rate is None
        modes = (no_rate and not self.queue and self.factor >= 1.0, no_rate and self.held <= self.cap)
        if modes != self.modes:
            self.modes = modes
            for c in self.clients.values():
                self._wake(c)
        if (owner := self.queue[0][1] if self.queue else None) != self.head_owner:
            self.head_owner = owner
            if owner is not None and self.clients[owner].held:
                self._wake(self.clients[owner])

    def _wake(self, c: ClientView) -> None:
        c.mail.set()
        if c.reaper is None:
            c.reaper = asyncio.get_running_loop().call_later(self.lease_ttl, self._drop, c, "silent")

    def _drop(self, c: ClientView, why: str = "left") -> None:
        """Take back the permits and tickets of a client that left, or is dead (its mail unread for
        lease_ttl: its process or loop is gone), so it neither shrinks the cap nor blocks the queue."""
        if why != "left":
            logger.warning("rate limiter %s: client %s %s for %.0fs; taking back its %d permits",
                           self.name, c.cid, why, self.lease_ttl, c.held)
        del self.clients[c.cid]
        self.held -= c.held
        self.queue = deque(e for e in self.queue if e[1] != c.cid)
        if c.reaper is not None:
            c.reaper.cancel()
        c.mail.set()  # a poll still waiting returns {"gone": True}
        self.gone[c.cid] = None  # as do its later calls
        if len(self.gone) > 10_000:
            del self.gone[next(iter(self.gone))]
        self._dispatch()
