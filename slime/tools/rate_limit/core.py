"""The arbiter of one limiter: permits, tickets, a token bucket and AIMD, on one asyncio loop.

Permits are conserved: free here, or held (in use or idle) by exactly one client, so the cap holds
exactly whatever the messages do. While nobody queues, clients keep released permits idle and reuse
them without asking (a lease). A caller that must queue gets a ticket, numbered in the order its
demand arrived here, and free permits go to tickets in number order: FIFO across processes. A client
whose ticket is the lowest unserved one (the frontier) may hand a permit one of its callers releases
straight to its own next waiter: it would have been sent there anyway, so no round trip and no
reordering. Tickets and the frontier only grow, so a hand-over crossing a grant from here costs only
a spare permit, which goes to the client's next ticket or comes back.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from typing import Any

logger = logging.getLogger(__name__)


class RateLimiterConfigError(ValueError):
    """A limiter of that name already exists with other limits."""


class RateLimiterUnavailable(RuntimeError):
    """The limiter's actor is gone (killed, or its node died)."""


class RateLimitTimeout(asyncio.TimeoutError):
    """`acquire(timeout=...)` gave up; nothing is held."""


class ClientState:
    __slots__ = ("held", "grants", "new_tickets", "mail", "woken_at", "closing")

    def __init__(self) -> None:
        self.held = 0  # permits it holds, in use or idle
        self.grants: list[int] = []  # its tickets served since its last poll
        self.new_tickets: list[int] = []  # tickets given to it since its last poll
        self.mail = asyncio.Event()  # its long poll returns when set
        self.woken_at: float | None = None  # mail unread for lease_ttl: presumed dead
        self.closing = False  # it left: forgotten once all its permits are back


class LimiterCore:
    """Also the limiter's Ray actor (actor.py): sync methods run on the actor's event loop."""

    def __init__(self, name: str, max_concurrency: int, rate_per_second: float | None = None,
                 burst: int | None = None, *, min_concurrency: int = 1, lease_ttl: float = 60.0,
                 cut_cooldown: float = 1.0) -> None:
        if int(max_concurrency) < 1:
            raise ValueError(f"rate limiter {name!r}: max_concurrency must be >= 1, got {max_concurrency}")
        self.name, self.max_cap = name, int(max_concurrency)
        self.min_cap = max(1, min(int(min_concurrency), self.max_cap))
        self.base_rate = float(rate_per_second) if rate_per_second and rate_per_second > 0 else None
        self.burst = int(burst) if burst else math.ceil(self.base_rate or 0)
        self.lease_ttl, self.cut_cooldown = lease_ttl, cut_cooldown
        self.factor = 1.0  # AIMD: scales cap and rate
        self.tokens, self._refilled_at, self._last_cut = float(self.burst), time.monotonic(), -math.inf
        self.out = self.next_ticket = 0  # permits held by clients; the next ticket's number
        self.queue: deque[tuple[int, str]] = deque()  # unserved (ticket, client id), in ticket order
        self.clients: dict[str, ClientState] = {}
        self.gone: dict[str, None] = {}  # clients that left or were reaped (the last 10k): void if they write
        self.modes, self._head_owner = self._modes(), None
        self._token_timer: asyncio.TimerHandle | None = None
        self._reaper: asyncio.TimerHandle | None = None
        self.granted = self.throttled = self.cuts = 0

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "max_concurrency": self.max_cap, "rate_per_second": self.base_rate,
                "burst": self.burst if self.base_rate else None}

    @property
    def cap(self) -> int:
        return max(self.min_cap, int(self.max_cap * self.factor))

    @property
    def rate(self) -> float | None:
        return self.base_rate * self.factor if self.base_rate else None

    def _modes(self) -> tuple[bool, bool]:
        """(lease, hand_over). Lease: nobody queues and no cut to recover from (the core must hear of
        successes). Hand-over: not above a cut cap. With a rate, every start takes a token from here."""
        if self.base_rate is not None:
            return False, False
        return not self.queue and self.factor >= 1.0, self.out <= self.cap

    # -- what clients call -----------------------------------------------------------------
    def push(self, cid: str, msg: dict[str, Any]) -> None:
        """One batched message: permits given back (`release`), tickets wanted (`need`) or dropped
        (`withdraw`), own tickets below `served_through` served by hand-over, `ok` / `throttled` calls,
        and leaving: `close` (permits in use count until released) or `abandon` (its loop is gone)."""
        if cid in self.gone:
            return
        c = self.clients.setdefault(cid, ClientState())
        release = min(msg.get("release", 0), c.held)
        c.held, self.out = c.held - release, self.out - release
        while self.queue and self.queue[0][0] < msg.get("served_through", 0) and self.queue[0][1] == cid:
            self.queue.popleft()
        if msg.get("withdraw"):
            dropped = set(msg["withdraw"])
            self.queue = deque(e for e in self.queue if e[0] not in dropped)
        if msg.get("throttled"):
            self.throttled += msg["throttled"]
            if time.monotonic() - self._last_cut >= self.cut_cooldown:  # multiplicative decrease
                self._last_cut, self.cuts = time.monotonic(), self.cuts + 1
                self.factor = max(self.min_cap / self.max_cap, self.factor / 2)
                self.tokens = min(self.tokens, self.burst * self.factor)
        elif msg.get("ok") and self.factor < 1.0:  # additive increase: +1 permit per `cap` successes
            self.factor = min(1.0, self.factor + msg["ok"] / (self.cap * self.max_cap))
        if msg.get("need"):
            new = range(self.next_ticket, self.next_ticket + msg["need"])
            self.next_ticket = new.stop
            self.queue.extend((t, cid) for t in new)
            c.new_tickets.extend(new)
            self._wake(c)
        if msg.get("close") or msg.get("abandon"):
            c.closing = True
            self.queue = deque(e for e in self.queue if e[1] != cid)
            if msg.get("abandon"):
                c.held, self.out = 0, self.out - c.held
        if c.closing and not c.held:
            self._forget(cid)
        self._dispatch()

    async def poll(self, cid: str) -> dict[str, Any]:
        """Long poll: returns once the client has news (grants, tickets, modes, its ticket at the head),
        or `gone` once it left (or was reaped: then it starts afresh)."""
        if cid not in self.gone:
            c = self.clients.setdefault(cid, ClientState())
            c.woken_at = None  # it read its last mail: alive
            await c.mail.wait()
            c.mail.clear()
        if cid in self.gone:
            del self.gone[cid]
            return {"gone": True}
        mail = {"grants": c.grants, "tickets": c.new_tickets, "lease": self.modes[0], "hand_over": self.modes[1],
                "frontier": self.queue[0][0] if self.queue else self.next_ticket}
        c.grants, c.new_tickets = [], []
        return mail

    def stats(self) -> dict[str, Any]:
        self._refill()
        return {"name": self.name, "cap": self.cap, "max_concurrency": self.max_cap, "rate_per_second": self.rate,
                "leased": self.out, "waiting": len(self.queue), "granted_by_core": self.granted,
                "throttled_429": self.throttled, "aimd_cuts": self.cuts, "aimd_factor": self.factor,
                "clients": len(self.clients), "tokens": self.tokens if self.base_rate else None}

    # -- internals -------------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Free permits (and tokens) to tickets in order; tell clients of new modes and of the head."""
        self._refill()
        while self.queue and self.out < self.cap:
            if self.base_rate is not None and self.tokens < 1:
                if self._token_timer is None:
                    self._token_timer = self._later((1 - self.tokens) / self.rate, self._on_token)
                break
            ticket, cid = self.queue.popleft()
            c = self.clients[cid]
            c.held, self.out, self.granted = c.held + 1, self.out + 1, self.granted + 1
            if self.base_rate is not None:
                self.tokens -= 1
            c.grants.append(ticket)
            self._wake(c)
        if (modes := self._modes()) != self.modes:
            self.modes = modes
            for c in self.clients.values():
                self._wake(c)
        if (owner := self.queue[0][1] if self.queue else None) != self._head_owner:
            self._head_owner = owner  # a new owner of the head may hand its releases to its tickets
            if owner is not None and self.clients[owner].held:
                self._wake(self.clients[owner])

    def _refill(self) -> None:
        now = time.monotonic()
        if self.base_rate is not None:
            self.tokens = min(float(self.burst), self.tokens + (now - self._refilled_at) * self.rate)
        self._refilled_at = now

    def _on_token(self) -> None:
        self._token_timer = None
        self._dispatch()

    def _later(self, delay: float, fn) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay, fn)

    def _wake(self, c: ClientState) -> None:
        if not c.closing:  # a client that left no longer reads mail; its permits in use are not dead
            c.mail.set()
            if c.woken_at is None:
                c.woken_at = time.monotonic()
                self._reaper = self._reaper or self._later(self.lease_ttl, self._reap)

    def _reap(self) -> None:
        """A client that left its mail unread for lease_ttl is dead (its process or loop is gone):
        take back its permits and tickets, so it can neither shrink the cap nor block the queue."""
        self._reaper, now = None, time.monotonic()
        for cid, c in list(self.clients.items()):
            if c.woken_at is not None and now - c.woken_at >= self.lease_ttl:
                logger.warning("rate limiter %s: client %s silent for %.0fs; taking back its %d permits",
                               self.name, cid, self.lease_ttl, c.held)
                self.out -= c.held
                self.queue = deque(e for e in self.queue if e[1] != cid)
                self._forget(cid)
        if pending := [c.woken_at for c in self.clients.values() if c.woken_at is not None]:
            self._reaper = self._later(min(pending) + self.lease_ttl - now, self._reap)
        self._dispatch()

    def _forget(self, cid: str) -> None:
        self.clients.pop(cid).mail.set()  # a poll still waiting returns `gone`
        self.gone[cid] = None
        if len(self.gone) > 10_000:
            del self.gone[next(iter(self.gone))]
