"""Cluster-wide rate limiter: an exact concurrency cap across processes, FIFO order, a token rate
(rate_per_second, burst) and AIMD on 429s, without a Ray round trip per call in the common case.

`LimiterCore` arbitrates one limiter and is its Ray actor; `RateLimiter` is a process's client of it, one per
event loop. Every permit is free in the core or held by exactly one client, so the cap is exact whatever the
messages do. While nobody queues, a client reuses the permits its callers release without asking (a lease).
A caller that must queue gets a ticket, numbered in the order its demand reached the core, and free permits go
to tickets in number order: FIFO across processes. A client whose ticket is the queue head gives a permit its
callers release straight to its next caller, as the core would: no round trip, no reordering. Tickets and the
head only grow, so a grant crossing such a hand-over costs only a spare permit, which the client uses or returns.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
import uuid
from collections import Counter, deque
from typing import Any

logger = logging.getLogger(__name__)
ACTOR_PREFIX, NAMESPACE = "slime_rate_limiter::", "slime"  # the actors' names: found from any Ray job

_clients: dict[str, list[RateLimiter]] = {}  # this process's clients, by limiter name: one per event loop


class RateLimiterConfigError(ValueError):
    """A limiter of that name already exists with other limits."""


class RateLimiterUnavailable(RuntimeError):
    """The limiter's actor is gone (killed, or its node died), or this client was closed."""


class RateLimitTimeout(asyncio.TimeoutError):
    """`acquire(timeout=...)` gave up; nothing is held."""


class ClientView:
    """What the core knows of one client (one event loop of one process)."""

    def __init__(self, cid: str) -> None:
        self.cid, self.held = cid, 0  # permits it holds, in use or idle
        self.grants: list[int] = []  # its tickets served since it last polled
        self.tickets: list[int] = []  # tickets given to it since it last polled
        self.mail = asyncio.Event()  # set: its long poll returns
        self.reaper: asyncio.TimerHandle | None = None  # armed while its mail is unread (set)


class LimiterCore:
    """One limiter's permits, tickets, token bucket and AIMD; as a Ray actor, an async one (one event loop)."""

    def __init__(
        self,
        name: str,
        max_concurrency: int,
        rate_per_second: float | None = None,
        burst: int | None = None,
        *,
        lease_ttl: float = 60.0,
        cut_cooldown: float = 1.0,
    ) -> None:
        if int(max_concurrency) < 1:
            raise ValueError(f"rate limiter {name!r}: max_concurrency must be >= 1, got {max_concurrency}")
        self.name, self.max_cap, self.lease_ttl, self.cut_cooldown = name, int(max_concurrency), lease_ttl, cut_cooldown
        self.base_rate = float(rate_per_second) if rate_per_second and rate_per_second > 0 else None
        self.burst = (int(burst) if burst else math.ceil(self.base_rate)) if self.base_rate else math.inf
        self.factor = 1.0  # AIMD scales the cap and the rate by this
        self.tokens, self.refilled_at, self.last_cut = float(self.burst), time.monotonic(), -math.inf
        self.held = self.next_ticket = self.throttled = self.cuts = 0
        self.queue: deque[tuple[int, str]] = deque()  # unserved (ticket, client id), ascending
        self.clients: dict[str, ClientView] = {}
        self.gone: dict[str, None] = {}  # the last 10,000 clients dropped: their late messages are void
        self.modes, self.head_owner = (False, False), None  # see _dispatch
        self.token_timer: asyncio.TimerHandle | None = None

    def config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "max_concurrency": self.max_cap,
            "rate_per_second": self.base_rate,
            "burst": self.burst if self.base_rate else None,
        }

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
        c.reaper.cancel()  # it reads its mail: alive
        mail = {
            "grants": c.grants,
            "tickets": c.tickets,
            "head": self.queue[0][0] if self.queue else self.next_ticket,
            "lease": self.modes[0],
            "hand_over": self.modes[1],
        }
        c.grants, c.tickets = [], []
        return mail

    def stats(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "cap": self.cap,
            "leased": self.held,
            "waiting": len(self.queue),
            "throttled_429": self.throttled,
            "aimd_cuts": self.cuts,
            "clients": len(self.clients),
        }

    def _dispatch(self) -> None:
        """Free permits (and tokens) to tickets in order. Tell every client of new modes: lease while
        nobody queues and no cut is being recovered from (the core must then hear of successes), hand-over
        unless above a cut cap; neither with a rate (every start takes a token from here). And tell the
        owner of a new queue head, which may now hand the permits its callers release to its tickets."""
        now, rate = time.monotonic(), (self.base_rate or 0.0) * self.factor
        self.tokens = min(self.burst, self.tokens + (now - self.refilled_at) * rate)
        self.refilled_at = now
        while self.queue and self.held < self.cap:
            if self.tokens < 1:  # never without a rate: its bucket is bottomless (burst = inf)
                if self.token_timer is not None:
                    self.token_timer.cancel()
                self.token_timer = asyncio.get_running_loop().call_later((1 - self.tokens) / rate, self._dispatch)
                break
            ticket, cid = self.queue.popleft()
            c = self.clients[cid]
            c.held, self.held = c.held + 1, self.held + 1
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
        if not c.mail.is_set():  # news: unread for lease_ttl, the client is dead
            c.mail.set()
            c.reaper = asyncio.get_running_loop().call_later(self.lease_ttl, self._drop, c, "silent")

    def _drop(self, c: ClientView, why: str = "left") -> None:
        """Take back the permits and tickets of a client that left, or is dead (its mail unread for
        lease_ttl: its process or loop is gone), so it neither shrinks the cap nor blocks the queue."""
        if why != "left":
            logger.warning(
                "rate limiter %s: client %s %s for %.0fs; taking back its %d permits",
                self.name,
                c.cid,
                why,
                self.lease_ttl,
                c.held,
            )
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


class RateLimiter:
    """A process's client of one limiter, bound to the event loop it is made in: `acquire()`, then `release()` on
    every exit path (`throttled=True` after a 429). `core`: a `LimiterCore` on this loop, or its actor's handle."""

    def __init__(self, core, name: str = "") -> None:
        self.core, self.name, self.cid = core, name, f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.remote = hasattr(core.push, "remote")  # a Ray actor handle
        self.loop = asyncio.get_running_loop()  # the one it serves
        self.poller = self.loop.create_task(self._poll_forever())  # reads the core's mail (LimiterCore.poll)
        self.idle = self.inflight = 0  # permits held here: unused, in use
        self.waiters: deque[asyncio.Future] = deque()  # callers waiting for a permit, oldest first
        self.tickets: deque[int] = deque()  # our unserved tickets, ascending
        self.tickets_asked = 0  # asked for, numbers not known yet
        self.head = 0  # the lowest unserved ticket of all clients, as far as we know
        self.lease = self.hand_over = False  # what the core allows now (LimiterCore._dispatch)
        self.outbox: Counter = Counter()  # the next message to the core (LimiterCore.push)
        self.sending: asyncio.Future | asyncio.Handle | None = None  # a message on its way, or due (_send)
        self.broken: BaseException | None = None  # why this client cannot be used: closed, or the core is gone
        self.handed_over = self.throttled_count = 0

    async def acquire(self, timeout: float | None = None) -> None:
        """Take one permit; `RateLimitTimeout` after `timeout` s, `RateLimiterUnavailable` if the core is gone."""
        if self.broken is not None:
            raise RateLimiterUnavailable(f"rate limiter {self.name!r} is unavailable: {self.broken}")
        if self.lease and self.idle and not self.waiters:
            self.idle, self.inflight = self.idle - 1, self.inflight + 1
            return
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError("a RateLimiter client serves one event loop; use client_for() in each loop")
        self.waiters.append(fut := self.loop.create_future())
        self._pump()
        try:
            await asyncio.wait_for(fut, timeout)
        except BaseException as e:
            if not fut.cancelled() and fut.exception() is None:
                self.release()  # served just as we gave up: give it back
            elif fut in self.waiters:  # timed out, or our task was cancelled
                self.waiters.remove(fut)
            self._pump()  # withdraw the ticket nobody needs now
            if type(e) is TimeoutError:
                raise RateLimitTimeout(f"no permit from rate limiter {self.name!r} in {timeout} s") from None
            raise

    def release(self, throttled: bool = False) -> None:
        """Give back one permit; `throttled=True` reports a 429 (AIMD cut), else a success."""
        if self.inflight <= 0:
            raise RuntimeError("release() without a matching acquire()")
        self.inflight, self.idle = self.inflight - 1, self.idle + 1
        self.throttled_count += throttled
        if throttled or not self.lease:  # the core counts successes while it recovers from a cut
            self.outbox["throttled" if throttled else "ok"] += 1
        self._pump()

    @property
    def n_waiting(self) -> int:
        return len(self.waiters)

    async def global_stats(self) -> dict[str, Any]:
        return await self._call("stats") if self.remote else self.core.stats()

    def close(self) -> None:
        """Leave: waiters fail and every permit held here goes back to the core, those still in use too:
        call it once they are released, or when the event loop they were used in has closed (client_for)."""
        if self.broken is None:
            self.broken = RuntimeError("client closed")
            self._call("push", self.cid, {"leave": True})
            if not self.loop.is_closed():
                self._break()

    def _call(self, method: str, *args: Any) -> Any:
        """A method of the core; of its actor: an ObjectRef of the result (awaitable)."""
        fn = getattr(self.core, method)
        return fn.remote(*args) if self.remote else fn(*args)

    def _serve_oldest(self) -> bool:
        """Give a permit to the oldest waiter; False if none is waiting."""
        while self.waiters:
            if not (fut := self.waiters.popleft()).done():  # done: cancelled, its task not run yet
                self.inflight += 1
                fut.set_result(None)
                return True
        return False

    def _pump(self) -> None:
        """Serve waiters from idle permits where the core allows it, give back what must go back, hold
        as many tickets as there are waiters, and send all that."""
        while self.idle and self.waiters:
            if not self.lease:
                if not (self.hand_over and self.tickets and self.tickets[0] == self.head):
                    break
                self.tickets.popleft()  # our ticket is the head: the core would send this permit to it anyway
                self.head = self.outbox["served_through"] = self.head + 1
                self.handed_over += 1
            self.idle -= self._serve_oldest()
        if self.broken is not None:
            return
        if self.idle and not self.lease:
            self.outbox["release"] += self.idle
            self.idle = 0
        have, want = len(self.tickets) + self.tickets_asked, len(self.waiters)
        if want > have:
            self.tickets_asked += want - have
            self.outbox["need"] += want - have
        elif have > want and self.tickets:  # callers gave up: drop our newest tickets
            self.outbox.setdefault("withdraw", []).extend(
                self.tickets.pop() for _ in range(min(have - want, len(self.tickets)))
            )
        if self.outbox and self.sending is None:
            self.sending = self.loop.call_soon(self._send)

    def _send(self, ack: asyncio.Future | None = None) -> None:
        """Send the outbox, once per loop tick and one message on its way at most, so batches grow with
        load; `ack`: the last message arrived (or failed)."""
        self.sending = None
        if ack is not None and (ack.cancelled() or ack.exception() is not None):
            return self._break(ack.exception() if not ack.cancelled() else RuntimeError("message cancelled"))
        if self.outbox and self.broken is None:
            msg, self.outbox = self.outbox, Counter()
            if (ack := self._call("push", self.cid, msg)) is not None:  # None: applied (a core on this loop)
                self.sending = asyncio.wrap_future(ack.future())
                self.sending.add_done_callback(self._send)

    async def _poll_forever(self) -> None:
        try:
            while not (mail := await self._call("poll", self.cid)).get("gone"):
                self.tickets.extend(mail["tickets"])
                self.tickets_asked -= len(mail["tickets"])
                for ticket in mail["grants"]:
                    if self.tickets and self.tickets[0] == ticket:
                        self.tickets.popleft()
                        if self._serve_oldest():
                            continue
                    self.idle += 1  # nobody waits, or a spare: its ticket was handed over already or withdrawn
                self.head = max(self.head, mail["head"])
                self.lease, self.hand_over = mail["lease"], mail["hand_over"]
                self._pump()
            self._break(RuntimeError("the limiter took back this client's permits: it was silent for lease_ttl"))
        except Exception as e:  # noqa: BLE001 - the actor died: fail loudly, never hang callers
            self._break(e)

    def _break(self, e: BaseException | None = None) -> None:
        """Fail the waiters, never hang them: the core is gone (`e`), took our permits back, or we closed."""
        if self.broken is None:
            logger.error("rate limiter %s unavailable: %r", self.name, e)
            self.broken = e
        while self.waiters:
            if not (fut := self.waiters.popleft()).done():
                fut.set_exception(RateLimiterUnavailable(f"rate limiter {self.name!r} is unavailable: {self.broken}"))


def local_rate_limiter(
    max_concurrency: int,
    rate_per_second: float | None = None,
    burst: int | None = None,
    name: str = "local",
    **options: Any,
) -> RateLimiter:
    """A limiter for this event loop only (no Ray), with the same API and semantics."""
    return RateLimiter(LimiterCore(name, max_concurrency, rate_per_second, burst, **options), name)


def get_or_create_rate_limiter(
    name: str,
    max_concurrency: int,
    rate_per_second: float | None = None,
    burst: int | None = None,
    *,
    detached: bool = False,
    **options: Any,
):
    """The limiter actor for resource `name`, created if missing; keep the handle (a non-detached actor lives while
    a handle does, a detached one until `kill_rate_limiter`). Other limits than the existing actor's raise
    `RateLimiterConfigError`. `options`: lease_ttl, cut_cooldown (LimiterCore)."""
    import ray

    want = LimiterCore(name, max_concurrency, rate_per_second, burst, **options).config()
    handle = (
        ray.remote(LimiterCore)
        .options(
            name=ACTOR_PREFIX + name,
            namespace=NAMESPACE,
            get_if_exists=True,
            lifetime="detached" if detached else None,
            num_cpus=0,
            max_restarts=0,
            max_concurrency=100_000,  # each client keeps a long poll waiting
        )
        .remote(name, max_concurrency, rate_per_second, burst, **options)
    )
    if (have := ray.get(handle.config.remote())) != want:
        raise RateLimiterConfigError(
            f"rate limiter {name!r} already exists with {have}, asked for {want}; "
            "give each tool or service its own name, or use the same limits"
        )
    return handle


def get_rate_limiter(name: str):
    """The existing limiter actor for `name`, or None (never creates one)."""
    import ray

    try:
        return ray.get_actor(ACTOR_PREFIX + name, namespace=NAMESPACE)
    except ValueError:
        return None


def kill_rate_limiter(name: str) -> bool:
    """Kill the limiter actor (its clients then raise `RateLimiterUnavailable`); False if there was none."""
    import ray

    _clients.pop(name, None)
    if (handle := get_rate_limiter(name)) is not None:
        ray.kill(handle, no_restart=True)
    return handle is not None


def client_for(name: str, handle=None) -> RateLimiter:
    """This event loop's client of the global limiter `name` (looked up by name without `handle`: it must
    exist, else `RateLimiterUnavailable`). Clients of closed loops give their permits back here."""
    loop, mine = asyncio.get_running_loop(), _clients.setdefault(name, [])
    for c in list(mine):
        if c.loop is loop and c.broken is None:
            return c
        if c.broken is not None or c.loop.is_closed():
            c.close()  # e.g. one asyncio.run() per step: nothing in a closed loop still uses a permit
            mine.remove(c)
    if handle is None and (handle := get_rate_limiter(name)) is None:
        raise RateLimiterUnavailable(
            f"no rate limiter named {name!r}: the manager creates it with get_or_create_rate_limiter()"
        )
    mine.append(c := RateLimiter(handle, name))
    return c
