"""A process's client of one limiter, one per event loop; the protocol is in core.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections import deque
from typing import Any, AsyncIterator

from slime.tools.rate_limit.core import RateLimiterUnavailable, RateLimitTimeout

logger = logging.getLogger(__name__)


class Permit:
    """Yielded by `RateLimiter.limit()`: call `throttled()` if the guarded call got a 429."""

    was_throttled = False

    def throttled(self) -> None:
        self.was_throttled = True


class RateLimiter:
    """`async with limiter.limit(timeout=30) as permit:` releases on every exit path; call
    `permit.throttled()` on a 429. `backend`: a `LimiterCore` on this loop, or an `ActorBackend`."""

    def __init__(self, backend, name: str = "") -> None:
        self.backend, self.name, self.cid = backend, name, f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.loop: asyncio.AbstractEventLoop | None = None
        self.idle = self.inflight = 0  # permits held here: not in use, in use
        self.waiters: deque[asyncio.Future] = deque()
        self.n_waiting = 0  # waiters neither served nor given up
        self.tickets: deque[int] = deque()  # ours, unserved, ascending
        self.tickets_asked = 0  # asked for, not given yet
        self.frontier = 0  # the lowest unserved ticket anywhere, as far as we know
        self.lease = self.hand_over = False  # what the core allows (LimiterCore._modes)
        self._outbox: dict[str, Any] = {}
        self._sending: asyncio.Future | None = None  # one message on its way at most: batches grow under load
        self._flush_due = self.closed = False
        self._poller: asyncio.Task | None = None
        self.broken: BaseException | None = None
        self.handed_over = self.throttled_count = 0

    async def acquire(self, timeout: float | None = None) -> None:
        """Take one permit; `RateLimitTimeout` after `timeout` s, `RateLimiterUnavailable` if the actor is gone."""
        if self.broken is not None:
            raise RateLimiterUnavailable(f"rate limiter {self.name!r} is unavailable: {self.broken}")
        if self.closed:
            raise RuntimeError(f"rate limiter client {self.name!r} is closed")
        if self.lease and self.idle and not self.n_waiting:
            self.idle, self.inflight = self.idle - 1, self.inflight + 1
            return
        loop = self._bind_loop()
        fut = loop.create_future()
        self.waiters.append(fut)
        self.n_waiting += 1
        timer = loop.call_later(timeout, self._expire, fut) if timeout is not None else None
        self._pump()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.cancelled():  # by our task's cancellation (`n_waiting` counts it until here)
                self.n_waiting -= 1
            elif fut.exception() is None:
                self.release()  # served in the tick it was cancelled: give it back
            self._pump()  # withdraw the ticket nobody needs now
            raise
        except BaseException:
            self._pump()
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def release(self, throttled: bool = False) -> None:
        """Give back one permit; `throttled=True` reports a 429 (AIMD cut), else a success."""
        if self.inflight <= 0:
            raise RuntimeError("release() without a matching acquire()")
        self.inflight, self.idle = self.inflight - 1, self.idle + 1
        if throttled:
            self.throttled_count += 1
            self._add("throttled", 1)
        elif not self.lease:  # the core counts successes while it recovers from a cut
            self._add("ok", 1)
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
        return {"in_flight": self.inflight, "waiting": self.n_waiting, "idle": self.idle,
                "handed_over": self.handed_over, "throttled_429": self.throttled_count}

    async def global_stats(self) -> dict[str, Any]:
        s = self.backend.stats()
        return s if isinstance(s, dict) else await s

    async def close(self) -> None:
        """Give back idle permits and leave; permits still in use count until released."""
        if not self.closed:
            self.closed = True
            self._fail_waiters(RuntimeError(f"rate limiter client {self.name!r} closed"))
            self._outbox["close"] = 1
            self._pump()
            self._flush()
            while self._sending is not None:  # until the core has it (our poll then ends)
                await asyncio.wait({self._sending})

    def abandon(self) -> None:
        """Leave without our loop (it closed): nothing in it can still use a permit, so all go back."""
        if not self.closed and self.broken is None:
            with contextlib.suppress(Exception):
                self.backend.push(self.cid, {"abandon": 1})
        self.closed = True

    # -- internals -------------------------------------------------------------------------
    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if (self.loop or loop) is not loop:
            raise RuntimeError("a RateLimiter client serves one event loop; use client_for() in each loop")
        self.loop = loop
        self._poller = self._poller or loop.create_task(self._poll_forever())
        return loop

    def _expire(self, fut: asyncio.Future) -> None:
        if not fut.done():
            self.n_waiting -= 1
            fut.set_exception(RateLimitTimeout(f"no permit from rate limiter {self.name!r} in time"))

    def _oldest_waiter(self) -> asyncio.Future | None:
        while self.waiters and self.waiters[0].done():  # timed out or cancelled
            self.waiters.popleft()
        return self.waiters[0] if self.waiters else None

    def _serve(self, fut: asyncio.Future) -> None:
        self.waiters.popleft()
        self.n_waiting, self.inflight = self.n_waiting - 1, self.inflight + 1
        fut.set_result(None)

    def _pump(self) -> None:
        """Serve waiters from idle permits where the core allows it, give back what must go back,
        and hold as many tickets as there are waiters."""
        while self.idle and (fut := self._oldest_waiter()) is not None:
            if not self.lease:
                if not (self.hand_over and self.tickets and self.tickets[0] == self.frontier):
                    break
                self.tickets.popleft()  # our ticket is the head: the permit would be sent to it anyway
                self.frontier += 1
                self.handed_over += 1
                self._outbox["served_through"] = self.frontier
            self.idle -= 1
            self._serve(fut)
        if self.broken is not None:
            return
        if self.idle and (self.closed or not self.lease):
            self._add("release", self.idle)
            self.idle = 0
        have = len(self.tickets) + self.tickets_asked
        if self.n_waiting > have:
            self.tickets_asked += self.n_waiting - have
            self._add("need", self.n_waiting - have)
        elif have > self.n_waiting and self.tickets:  # waiters gave up: drop our newest tickets
            drop = min(have - self.n_waiting, len(self.tickets))
            self._outbox.setdefault("withdraw", []).extend(self.tickets.pop() for _ in range(drop))
        if self._outbox and not self._flush_due and self.loop is not None and not self.loop.is_closed():
            self._flush_due = True
            self.loop.call_soon(self._flush)

    def _on_mail(self, mail: dict[str, Any]) -> None:
        if mail.get("gone"):  # we left, or the core presumed us dead and took everything back
            self.idle = self.tickets_asked = 0
            self.tickets.clear()
        else:
            self.tickets.extend(mail["tickets"])
            self.tickets_asked -= len(mail["tickets"])
            for ticket in mail["grants"]:
                if self.tickets and self.tickets[0] == ticket:
                    self.tickets.popleft()
                    if (fut := self._oldest_waiter()) is not None:
                        self._serve(fut)
                        continue
                self.idle += 1  # a spare: its ticket was handed over here already, or withdrawn
            self.frontier = max(self.frontier, mail["frontier"])
            self.lease, self.hand_over = mail["lease"], mail["hand_over"]
        self._pump()

    def _add(self, key: str, n: int) -> None:
        self._outbox[key] = self._outbox.get(key, 0) + n

    def _flush(self) -> None:
        self._flush_due = False
        if not self._outbox or self._sending is not None or self.broken is not None:
            return
        msg, self._outbox = self._outbox, {}
        try:
            self._sending = self.backend.push(self.cid, msg)
        except Exception as e:  # noqa: BLE001
            self._break(e)
        if self._sending is not None:
            self._sending.add_done_callback(self._on_sent)

    def _on_sent(self, ack: asyncio.Future) -> None:
        self._sending = None
        if ack.cancelled() or ack.exception() is not None:
            self._break(ack.exception() or RuntimeError("message to the rate limiter cancelled"))
        else:
            self._flush()

    async def _poll_forever(self) -> None:
        try:
            while True:
                mail = await self.backend.poll(self.cid)
                if mail.get("gone") and self.closed:  # we left and the core let us go
                    return
                self._on_mail(mail)
        except Exception as e:  # noqa: BLE001 - the actor died: fail loudly, never hang callers
            self._break(e)

    def _break(self, e: BaseException) -> None:
        if self.broken is None:
            logger.error("rate limiter %s unavailable: %r", self.name, e)
            self.broken = e
        self._fail_waiters(RateLimiterUnavailable(f"rate limiter {self.name!r} is unavailable: {e}"))

    def _fail_waiters(self, e: BaseException) -> None:
        for fut in self.waiters:
            if not fut.done():
                self.n_waiting -= 1
                fut.set_exception(e)
        self.waiters.clear()
