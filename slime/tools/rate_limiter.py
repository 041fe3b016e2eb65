"""Cluster-wide rate limiter: an exact concurrency cap across processes, FIFO order, a token rate
(rate_per_second, burst) and AIMD on 429s, without a Ray round trip per call in the common case: the
protocol is in rate_limit/core.py, the arbiter; `RateLimiter` here is a process's client of it, one per
event loop. The RolloutManager creates one named actor per resource and keeps its handle; workers use
`client_for(name)`; `local_rate_limiter` is the same client and core without Ray."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections import Counter, deque
from typing import Any, AsyncIterator

from slime.tools.rate_limit.core import LimiterCore

logger = logging.getLogger(__name__)
ACTOR_PREFIX, NAMESPACE = "slime_rate_limiter::", "slime"  # the actors' names: found from any Ray job

# This process's clients of global limiters, keyed by limiter name: one per event loop.
_clients: dict[str, list[RateLimiter]] = {}


class RateLimiterConfigError(ValueError):
    """A limiter of that name already exists with other limits."""


class RateLimiterUnavailable(RuntimeError):
    """The limiter's actor is gone (killed, or its node died), or this client was closed."""


class RateLimitTimeout(asyncio.TimeoutError):
    """`acquire(timeout=...)` gave up; nothing is held."""


class Permit:
    """Yielded by `RateLimiter.limit()`: call `throttled()` if the guarded call got a 429."""

    was_throttled = False

    def throttled(self) -> None:
        self.was_throttled = True


class RateLimiter:
    """`async with limiter.limit(timeout=30) as permit:` holds one permit and gives it back on every exit
    path; call `permit.throttled()` on a 429. `core`: a `LimiterCore` on this loop, or its actor's handle."""

    def __init__(self, core, name: str = "") -> None:
        self.core, self.name, self.cid = core, name, f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.remote = hasattr(core.push, "remote")  # a Ray actor handle
        self.loop: asyncio.AbstractEventLoop | None = None
        self.poller: asyncio.Task | None = None  # reads the core's mail (LimiterCore.poll)
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
        loop = asyncio.get_running_loop()
        if (self.loop or loop) is not loop:
            raise RuntimeError("a RateLimiter client serves one event loop; use client_for() in each loop")
        self.loop, self.poller = loop, self.poller or loop.create_task(self._poll_forever())
        self.waiters.append(fut := loop.create_future())
        self._pump()
        try:
            async with asyncio.timeout(timeout):
                await fut
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

    @contextlib.asynccontextmanager
    async def limit(self, timeout: float | None = None) -> AsyncIterator[Permit]:
        await self.acquire(timeout)
        permit = Permit()
        try:
            yield permit
        finally:
            self.release(throttled=permit.was_throttled)

    def stats(self) -> dict[str, int]:
        return {"in_flight": self.inflight, "waiting": len(self.waiters), "idle": self.idle,
                "handed_over": self.handed_over, "throttled_429": self.throttled_count}

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
            if self.loop is not None and not self.loop.is_closed():
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
                self.tickets.pop() for _ in range(min(have - want, len(self.tickets))))
        if self.outbox and self.sending is None:
            self.sending = self.loop.call_soon(self._send)

    def _send(self, ack: asyncio.Future | None = None) -> None:
        """Send the outbox, once per loop tick and one message on its way at most, so batches grow with
        load; `ack`: the last message arrived (or failed)."""
        self.sending = None
        if ack is not None and (ack.cancelled() or ack.exception() is not None):
            return self._break(ack.exception() or RuntimeError("message to the rate limiter cancelled"))
        if self.outbox and self.broken is None:
            msg, self.outbox = self.outbox, Counter()
            if (ack := self._call("push", self.cid, msg)) is not None:  # None: applied (a core on this loop)
                self.sending = asyncio.wrap_future(ack.future())
                self.sending.add_done_callback(self._send)

    async def _poll_forever(self) -> None:
        try:
            while not (mail := await self._call("poll", self.cid)).get("gone"):
                self._on_mail(mail)
            self._break(RuntimeError("the limiter took back this client's permits: it was silent for lease_ttl"))
        except Exception as e:  # noqa: BLE001 - the actor died: fail loudly, never hang callers
            self._break(e)

    def _on_mail(self, mail: dict[str, Any]) -> None:
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

    def _break(self, e: BaseException | None = None) -> None:
        """Fail the waiters, never hang them: the core is gone (`e`), took our permits back, or we closed."""
        if self.broken is None:
            logger.error("rate limiter %s unavailable: %r", self.name, e)
            self.broken = e
        while self.waiters:
            if not (fut := self.waiters.popleft()).done():
                fut.set_exception(RateLimiterUnavailable(f"rate limiter {self.name!r} is unavailable: {self.broken}"))


def local_rate_limiter(max_concurrency: int, rate_per_second: float | None = None, burst: int | None = None,
                       name: str = "local", **options: Any) -> RateLimiter:
    """A limiter for this event loop only (no Ray), with the same API and semantics."""
    return RateLimiter(LimiterCore(name, max_concurrency, rate_per_second, burst, **options), name)


def get_or_create_rate_limiter(name: str, max_concurrency: int, rate_per_second: float | None = None,
                               burst: int | None = None, *, detached: bool = False, **options: Any):
    """The limiter actor for resource `name`, created if missing; keep the handle (a non-detached actor
    lives while a handle does; `detached=True`: until `kill_rate_limiter`). Other limits than the
    existing actor's raise `RateLimiterConfigError`. `options`: lease_ttl, cut_cooldown (LimiterCore)."""
    import ray

    want = LimiterCore(name, max_concurrency, rate_per_second, burst, **options).config()
    handle = ray.remote(LimiterCore).options(
        name=ACTOR_PREFIX + name, namespace=NAMESPACE, get_if_exists=True, lifetime="detached" if detached else None,
        num_cpus=0, max_restarts=0, max_concurrency=100_000,  # each client keeps a long poll waiting
    ).remote(name, max_concurrency, rate_per_second, burst, **options)
    if (have := ray.get(handle.config.remote())) != want:
        raise RateLimiterConfigError(f"rate limiter {name!r} already exists with {have}, asked for {want}; "
                                     "give each tool or service its own name, or use the same limits")
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
        if c.loop is loop or c.loop.is_closed() or c.broken is not None:
            c.close()  # e.g. one asyncio.run() per step: nothing in a closed loop still uses a permit
            mine.remove(c)
    if handle is None and (handle := get_rate_limiter(name)) is None:
        raise RateLimiterUnavailable(f"no rate limiter named {name!r}: the manager creates it with "
                                     "get_or_create_rate_limiter()")
    mine.append(c := RateLimiter(handle, name))
    c.loop = loop
    return c
