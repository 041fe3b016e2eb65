"""Cluster-wide rate limiter: a concurrency cap plus a token rate, held exactly across processes
and nodes, without a Ray round trip per call in the common case.

Design (compare the seed's `TokenBucketWorker`: a threading semaphore behind a Ray actor, three
Ray hops per call, no rate, one shared actor name, dies with whichever worker created it):

* `LimiterCore` is the whole arbiter (pure Python, asyncio). It owns ``cap`` permits and a token
  bucket (``rate_per_second``, ``burst``). Permits are *leased* to clients, a client per process
  (per event loop) and per resource name. Because permits are conserved (a permit is either free
  in the core, in transit, or held by exactly one client), the sum of permits in use anywhere is
  never above ``cap``: the cap holds exactly, whatever the leases.
* `RateLimiterActor` is the core behind a Ray named actor, one per resource name
  (``slime_rate_limiter::<name>``), created by the long-lived RolloutManager
  (`get_or_create_rate_limiter`), never by a worker in passing. Creating it again with another
  limit raises `RateLimiterConfigError`.
* `RateLimiter` is the per-process client. Uncontended, ``acquire`` takes a leased idle permit
  and a leased token locally: no Ray call (about a microsecond). When it runs out it asks the core
  for more (with prefetch of permits, never of tokens, so the burst bound stays exact). Messages
  are batched: at most one is in flight per client, and whatever accumulates meanwhile leaves
  with the next (self-clocked batching, no timer). Grants come back on one long-poll per client.
* Contention and FIFO: the core keeps one FIFO queue of demand for all callers and nodes
  (adjacent demand of one client is one entry). As soon as somebody *else* is queued, it recalls
  idle permits from a client and switches it to "contended" mode: its releases go back to the
  core and its acquires queue there, so permits are handed out in arrival order. The promise:
  once a caller's demand has reached the core, no later caller anywhere is served first.
  A client whose own callers are the only ones waiting keeps handing permits over locally.
  When the queue drains, clients lease locally again. Withdrawn demand (timeouts,
  cancellations) is confirmed by the core with the exact amount withdrawn, so a withdrawal
  racing a grant is never counted twice.
* Pledges (why contention stays cheap): strict FIFO would otherwise cost a round trip per
  hand-over even when the permit goes straight back to the process that released it. When the
  head entry of the queue belongs to a client that holds permits, the core *pledges* it the
  rest of that entry: the client serves those callers (its oldest waiters) with its own
  releases, locally, and reports how many it served with its next message. Until the core
  knows the pledge is used up, the pledge *is* the head of the queue: permits freed anywhere
  else go to it first and no entry behind it is served, so the order above is exactly what
  the core alone would produce (this is where the strict FIFO would send each of those permits
  anyway). The pledge grows when the next entry in line is the same client's. It ends when
  used up, or handed back (its callers timed out or were cancelled; an AIMD cut below what is
  out revokes it and its callers queue again). Pledge counts are kept as signed running sums on
  both sides, so a grant crossing a local hand-over is detected (the permit goes back, the
  pledge is restored) rather than lost. A pledge holds up the queue, so its holder is probed for
  liveness and reclaimed after ``lease_ttl`` if dead, like a client that ignores a recall. Only
  limiters without a token rate pledge: with a rate every call takes a token from the core
  anyway (so the burst bound stays exact). Under contention a hand-over between processes then
  costs a round trip per *batch of waiters* (all of one process's callers queued together), not
  per batch of permits.
* AIMD: a 429 reported by a caller (``release(throttled=True)``) halves the effective cap and rate
  (at most once per ``cut_cooldown`` s); successes grow them back additively (+1 permit per
  ``cap`` successes).
* No leaks: an acquire that times out or is cancelled gives back its demand (or the permit if it
  was granted in the race); `RateLimiter.limit()` releases on every exit path; `close()` returns
  all leases (permits still in use stay counted until released); a client whose event loop was
  closed is abandoned and its leases handed back when the process makes a new client. A client
  process that dies holding a lease is reclaimed once it has ignored a recall for ``lease_ttl``
  seconds (the only case where the core trusts a timeout).

The same client runs against an in-process core (`local_rate_limiter`) when the global limiter is
disabled, so both paths share one implementation.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, AsyncIterator

logger = logging.getLogger(__name__)

ACTOR_PREFIX = "slime_rate_limiter::"
_owned: dict[tuple[str, str], Any] = {}
DEFAULT_NAMESPACE = "slime"


class RateLimiterConfigError(ValueError):
    """A limiter of that name already exists with a different configuration."""


class RateLimiterUnavailable(RuntimeError):
    """The global limiter actor is gone (killed, or its node died)."""


class RateLimitTimeout(asyncio.TimeoutError):
    """`acquire(timeout=...)` gave up; nothing is held."""


# --------------------------------------------------------------------------------------------
# The arbiter
# --------------------------------------------------------------------------------------------


@dataclass
class _Entry:
    cid: str
    perm: int  # permits still needed
    tok: int  # tokens still needed
    xperm: int  # prefetch wished for (granted only when nobody else waits)
    xtok: int
    t0: float


class _ClientState:
    __slots__ = ("held", "perm", "tok", "pn", "tn", "recall", "contended", "event", "last_seen", "recall_since",
                 "inflight", "waiting", "dead", "closing", "pledged", "pledge_new", "pp", "revoke")

    def __init__(self) -> None:
        self.held = 0  # permits leased to this client (in use + idle + in transit)
        self.perm = 0  # mailbox: permits granted, not yet collected
        self.tok = 0
        self.pn = 0  # ... of which against the client's demand (the rest is prefetch)
        self.tn = 0
        self.recall = False
        self.contended = False
        self.event = asyncio.Event()
        self.last_seen = time.monotonic()
        self.recall_since: float | None = None
        self.inflight = 0  # as last reported by the client
        self.waiting = 0
        self.dead = False
        self.closing = False
        # callers of this client at the head of the FIFO it may serve by recycling its releases.
        # Signed, never clamped: it is a running sum of deltas from both sides (pledges and grants
        # here, recycles / hand-backs / restores reported by the client), so it equals the
        # client's own count once their messages cross, whatever order they cross in.
        self.pledged = 0
        self.pledge_new = 0  # mailbox: pledge granted, not yet collected
        self.pp = 0  # mailbox: permits granted against the pledge (included in `perm`)
        self.revoke = False  # mailbox: please hand your pledge back (AIMD cut below what is out)


class LimiterCore:
    """The arbiter: permits, token bucket, FIFO queue, AIMD, metrics. Single-threaded (asyncio)."""

    def __init__(self, name: str, max_concurrency: int, rate_per_second: float | None = None,
                 burst: int | None = None, *, min_concurrency: int = 1, lease_ttl: float = 60.0,
                 cut_cooldown: float = 1.0) -> None:
        if int(max_concurrency) < 1:
            raise ValueError("max_concurrency must be >= 1")
        if rate_per_second is not None and rate_per_second <= 0:
            rate_per_second = None
        self.name = name
        self.max_cap = int(max_concurrency)
        self.min_cap = max(1, min(int(min_concurrency), self.max_cap))
        self.base_rate = float(rate_per_second) if rate_per_second else None
        self.burst = int(burst) if burst else (max(1, int(math.ceil(self.base_rate))) if self.base_rate else 0)
        self.lease_ttl = lease_ttl
        self.cut_cooldown = cut_cooldown
        self.factor = 1.0  # AIMD multiplier of cap and rate
        self.tokens = float(self.burst)
        self._t = time.monotonic()
        self.out = 0  # permits held by clients
        self.clients: dict[str, _ClientState] = {}
        self.queue: deque[_Entry] = deque()
        self.pledges: dict[str, None] = {}  # clients holding a pledge, in FIFO order (at most one is created at a time)
        self.contended = False
        self._timer: asyncio.TimerHandle | None = None
        self._ttl_timer: asyncio.TimerHandle | None = None
        self._last_cut = -1e9
        self._watchers: list[tuple[int, asyncio.Future]] = []
        # metrics
        self.granted = 0
        self.throttled = 0
        self.cuts = 0
        self.waits = 0
        self.wait_total = 0.0
        self.wait_max = 0.0

    # -- configuration -------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        return {"name": self.name, "max_concurrency": self.max_cap, "rate_per_second": self.base_rate,
                "burst": self.burst if self.base_rate else None}

    @property
    def cap(self) -> int:
        return max(self.min_cap, int(self.max_cap * self.factor))

    @property
    def rate(self) -> float | None:
        return self.base_rate * self.factor if self.base_rate else None

    # -- token bucket --------------------------------------------------------------------
    def _refill(self) -> None:
        now = time.monotonic()
        if self.base_rate:
            self.tokens = min(float(self.burst), self.tokens + (now - self._t) * self.rate)
        self._t = now

    # -- messages from clients -----------------------------------------------------------
    def _client(self, cid: str) -> _ClientState:
        c = self.clients.get(cid)
        if c is None:
            c = self.clients[cid] = _ClientState()
            c.contended = self.contended
        c.last_seen = time.monotonic()
        c.recall_since = None
        return c

    def push(self, cid: str, release: int = 0, ret_tok: int = 0, need: int = 0, need_tok: int = 0,
             want: int = 0, want_tok: int = 0, cancel: int = 0, cancel_tok: int = 0, ok: int = 0,
             throttled: int = 0, inflight: int | None = None, waiting: int | None = None,
             recycled: int = 0, unpledge: int = 0, restore: int = 0) -> dict[str, int]:
        """Apply one batched message from a client; returns how much of its cancel was applied."""
        c = self._client(cid)
        if recycled or unpledge or restore:
            # before the releases: a release sent after the pledge was used up must go to the
            # next in line, not back to this client as a stale pledge grant
            self.granted += recycled
            self._pledge(cid, c, restore - recycled - unpledge)
        if release:
            release = min(release, c.held)  # a reclaimed (presumed dead) client cannot free twice
            c.held -= release
            self.out -= release
            if c.closing and c.held <= 0 and not (need or need_tok or want or want_tok):
                self.clients.pop(cid, None)
        self._refill()
        if ret_tok and self.base_rate:
            self.tokens = min(float(self.burst), self.tokens + ret_tok)
        if inflight is not None:
            c.inflight = inflight
        if waiting is not None:
            c.waiting = waiting
        if throttled:
            self.throttled += throttled
            now = time.monotonic()
            if now - self._last_cut >= self.cut_cooldown:
                self._last_cut = now
                self.cuts += 1
                self.factor = max(self.min_cap / self.max_cap, self.factor * 0.5)
                self.tokens = min(self.tokens, float(self.burst) * self.factor)
        elif ok and self.factor < 1.0:
            # additive increase: about +1 permit per `cap` successes
            self.factor = min(1.0, self.factor + ok / (self.cap * self.max_cap))
        if need or need_tok or want > need or want_tok > need_tok:
            if not self.base_rate:
                need_tok = want_tok = 0
            xp, xt = max(0, want - need), max(0, want_tok - need_tok)
            tail = self.queue[-1] if self.queue else None
            if tail is not None and tail.cid == cid:  # adjacent demand of one client: one batch
                tail.perm += need
                tail.tok += need_tok
                tail.xperm += xp
                tail.xtok += xt
            else:
                self.queue.append(_Entry(cid, need, need_tok, xp, xt, time.monotonic()))
        applied = (0, 0)
        if cancel or cancel_tok:  # after the append: a message may carry a demand and its withdrawal
            applied = self._cancel(cid, cancel, cancel_tok)
        self._dispatch()
        return {"cancelled": applied[0], "cancelled_tok": applied[1]}

    def _cancel(self, cid: str, perm: int, tok: int) -> tuple[int, int]:
        """Withdraw up to (perm, tok) of the client's queued demand, newest first; returns what
        was actually withdrawn (the rest was granted already and is on its way)."""
        want_p, want_t = perm, tok
        for e in reversed(self.queue):
            if e.cid != cid:
                continue
            e.xperm = e.xtok = 0
            d = min(perm, e.perm)
            e.perm -= d
            perm -= d
            d = min(tok, e.tok)
            e.tok -= d
            tok -= d
        self.queue = deque(e for e in self.queue if e.perm or e.tok or e.xperm or e.xtok)
        return want_p - perm, want_t - tok

    def _pledge(self, cid: str, c: _ClientState, delta: int) -> None:
        c.pledged += delta
        if c.pledged > 0:
            self.pledges.setdefault(cid, None)
            if delta > 0:
                self._probe(c)
        else:
            self.pledges.pop(cid, None)

    def _probe(self, c: _ClientState) -> None:
        """A pledge holds up the whole queue: make sure its holder is alive. Wake its poll; a
        live client polls again at once (which clears `recall_since`), a dead one is reclaimed
        after ``lease_ttl`` like a client that ignores a recall."""
        if c.recall_since is None:
            c.recall_since = time.monotonic()
        c.event.set()

    def _deliver(self, cid: str, perm: int, tok: int, need_perm: int | None = None, need_tok: int | None = None) -> None:
        c = self.clients[cid]
        c.perm += perm
        c.tok += tok
        c.pn += perm if need_perm is None else need_perm
        c.tn += tok if need_tok is None else need_tok
        c.held += perm
        self.out += perm
        self.tokens -= tok
        self.granted += perm
        c.event.set()

    def _dispatch(self) -> None:
        self._reclaim_dead()
        self._refill()
        over = self.out > self.cap
        if over:  # an AIMD cut: nobody may keep recycling permits above the new cap
            for cid in self.pledges:
                c = self.clients[cid]
                if not c.revoke:
                    c.revoke = True
                    c.event.set()
        # Pledges are the head of the FIFO (converted from head entries): free permits go there first.
        for cid in list(self.pledges):
            free = self.cap - self.out
            if free <= 0:
                break
            c = self.clients[cid]
            g = min(c.pledged, free)
            c.pp += g
            self._deliver(cid, g, 0, 0, 0)
            self._probe(c)
            self._pledge(cid, c, -g)
        if len(self.pledges) == 1 and self.queue and not over:
            cid = next(iter(self.pledges))
            e = self.queue[0]
            if e.cid == cid and e.perm:  # the next in line is the pledge holder again: extend it
                self.queue.popleft()
                c = self.clients[cid]
                c.pledge_new += e.perm
                self._pledge(cid, c, e.perm)
                c.event.set()
        while self.queue and not self.pledges:
            e = self.queue[0]
            free = max(0, self.cap - self.out)
            toks = int(self.tokens) if self.base_rate else 0
            gp = min(e.perm, free)
            gt = min(e.tok, toks) if self.base_rate else 0
            if e.perm and gp < e.perm or e.tok and gt < e.tok:
                # the head cannot be served fully: serve what we can, keep its place
                if gp or gt:
                    e.perm -= gp
                    e.tok -= gt
                    self._deliver(e.cid, gp, gt)
                c = self.clients[e.cid]
                if not self.base_rate and not over and e.perm and c.held > 0 and not c.dead:
                    # The head's client holds permits: pledge it the rest of its batch. It serves
                    # those callers with its own releases (no round trip); until it reports them
                    # served, every permit freed elsewhere goes to it too, and nobody behind moves.
                    self.queue.popleft()
                    c.pledge_new += e.perm
                    self._pledge(e.cid, c, e.perm)
                    waited = time.monotonic() - e.t0
                    self.waits += 1
                    self.wait_total += waited
                    self.wait_max = max(self.wait_max, waited)
                    c.event.set()
                break
            self.queue.popleft()
            e.perm -= gp
            e.tok -= gt
            waited = time.monotonic() - e.t0
            if gp:
                self.waits += 1
                self.wait_total += waited
                self.wait_max = max(self.wait_max, waited)
            xp = xt = 0
            if not self.queue:  # nobody else waits: the prefetch is free to take
                xp = min(e.xperm, max(0, self.cap - self.out - gp))
                xt = min(e.xtok, max(0, int(self.tokens) - gt)) if self.base_rate else 0
            if gp or gt or xp or xt:
                self._deliver(e.cid, gp + xp, gt + xt, gp, gt)
        # A client is "contended" when somebody *else* waits (or the cap was cut below what is
        # out): then it must give idle permits back and route acquires and releases through the
        # queue, so that permits go first-come first-served across processes. A client whose
        # own callers are the only ones waiting keeps handing permits over locally (no hop).
        owners = {e.cid for e in self.queue} | set(self.pledges)
        self.contended = bool(owners) or over
        for cid, c in self.clients.items():
            if c.dead:
                continue
            want = over or len(owners) > (1 if cid in owners else 0)
            if want != c.contended:
                c.contended = want
                if want and not c.recall:
                    c.recall = True
                    c.recall_since = time.monotonic()
                c.event.set()
        if self.queue and self.base_rate:
            head = self.queue[0]
            if head.tok and self.tokens < 1 and self._timer is None:
                delay = (1.0 - self.tokens) / self.rate
                self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)
        if self.contended and self._ttl_timer is None and any(c.recall_since for c in self.clients.values()):
            # a client that never answers a recall (its process died) is reclaimed after lease_ttl
            self._ttl_timer = asyncio.get_running_loop().call_later(self.lease_ttl + 0.01, self._on_ttl)
        if self._watchers:
            n_wait = self._n_waiting()
            for item in list(self._watchers):
                if n_wait >= item[0] and not item[1].done():
                    item[1].set_result(n_wait)
                    self._watchers.remove(item)

    def _n_waiting(self) -> int:
        return sum(e.perm for e in self.queue) + sum(self.clients[cid].pledged for cid in self.pledges)

    async def wait_waiting(self, n: int, timeout: float = 30.0) -> int:
        """Resolve once at least `n` permits are queued (for tests and tooling; event-driven)."""
        fut = asyncio.get_running_loop().create_future()
        self._watchers.append((n, fut))
        self._dispatch()
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._watchers = [w for w in self._watchers if w[1] is not fut]

    def _on_timer(self) -> None:
        self._timer = None
        self._dispatch()

    def _on_ttl(self) -> None:
        self._ttl_timer = None
        self._dispatch()

    def _reclaim_dead(self) -> None:
        if not self.contended:
            return
        now = time.monotonic()
        for cid, c in self.clients.items():
            if ((c.held or c.pledged > 0) and c.recall_since is not None and now - c.recall_since > self.lease_ttl
                    and not c.dead):
                logger.warning("rate limiter %s: client %s ignored a recall for %.0fs, reclaiming %d permits",
                               self.name, cid, self.lease_ttl, c.held)
                self.out -= c.held
                c.held = 0
                c.dead = True
                c.pledged = c.perm = c.pn = c.pp = c.pledge_new = 0
                self.pledges.pop(cid, None)
                self._cancel(cid, 1 << 30, 1 << 30)

    async def poll(self, cid: str) -> dict[str, Any]:
        """Long-poll: once there is news, returns the client's mailbox: permits and tokens granted
        (`perm`, `tok`; `pn`, `tn` of them against demand, `pp` against the pledge), a new pledge,
        whether its old pledge was revoked, and the recall / contended flags."""
        c = self._client(cid)
        c.dead = False
        await c.event.wait()
        c.event.clear()
        c.last_seen = time.monotonic()
        out = {"perm": c.perm, "tok": c.tok, "recall": c.recall, "contended": c.contended, "pn": c.pn,
               "tn": c.tn, "pledge": c.pledge_new, "pp": c.pp, "revoke": c.revoke}
        c.perm = c.tok = c.pn = c.tn = c.pledge_new = c.pp = 0
        c.revoke = False
        if c.recall:
            c.recall = False
            c.recall_since = None
        return out

    def unregister(self, cid: str, release: int = 0, ret_tok: int = 0, in_use: int | None = None) -> None:
        """Client leaving: take back what it hands in. Permits it still has in use stay counted
        (the cap must hold) until their releases arrive; then the client is forgotten.

        `in_use` (what the client still has in use when it leaves) also takes back grants it will
        never collect: still in its mailbox, or on their way in a poll it has stopped reading.
        A client's messages are applied in order, so nothing it sent earlier is still pending."""
        self.push(cid, release=release, ret_tok=ret_tok)
        self._cancel(cid, 1 << 30, 1 << 30)
        c = self.clients.get(cid)
        if c is not None:
            if in_use is not None and c.held > in_use:
                self.out -= c.held - in_use
                c.held = in_use
            c.perm = c.pn = c.pp = c.pledge_new = 0
            c.pledged = 0
            self.pledges.pop(cid, None)
            c.closing = True
            c.event.set()  # its poll returns
            if c.held <= 0:
                self.clients.pop(cid, None)
        self._dispatch()

    def stats(self) -> dict[str, Any]:
        self._refill()
        return {
            "name": self.name, "cap": self.cap, "max_concurrency": self.max_cap, "rate_per_second": self.rate,
            "leased": self.out, "in_flight": sum(c.inflight for c in self.clients.values()),
            "waiting": self._n_waiting(), "queued_requests": len(self.queue),
            "pledged": sum(self.clients[cid].pledged for cid in self.pledges),
            "granted": self.granted, "throttled_429": self.throttled, "aimd_cuts": self.cuts,
            "aimd_factor": self.factor, "wait_count": self.waits, "wait_time_total_s": self.wait_total,
            "wait_time_max_s": self.wait_max, "clients": len(self.clients), "contended": self.contended,
            "tokens": self.tokens if self.base_rate else None,
        }


# --------------------------------------------------------------------------------------------
# The Ray actor
# --------------------------------------------------------------------------------------------

_actor_cls = None


def _actor_class():
    global _actor_cls
    if _actor_cls is None:
        import ray

        @ray.remote(num_cpus=0, max_restarts=0)
        class RateLimiterActor:
            """`LimiterCore` behind a Ray named actor. All methods are async: one event loop, no locks."""

            def __init__(self, name: str, max_concurrency: int, rate_per_second: float | None = None,
                         burst: int | None = None, kwargs: dict | None = None) -> None:
                self.core = LimiterCore(name, max_concurrency, rate_per_second, burst, **(kwargs or {}))

            async def config(self) -> dict[str, Any]:
                return self.core.config()

            async def push(self, cid: str, kw: dict[str, int]) -> dict[str, int]:
                return self.core.push(cid, **kw)

            async def poll(self, cid: str) -> dict[str, Any]:
                return await self.core.poll(cid)

            async def unregister(self, cid: str, release: int = 0, ret_tok: int = 0,
                                 in_use: int | None = None) -> None:
                self.core.unregister(cid, release, ret_tok, in_use)

            async def stats(self) -> dict[str, Any]:
                return self.core.stats()

            async def queue_snapshot(self):
                """Debugging: the queue as (client, permits, prefetch) and each client's (held, contended)."""
                return [(e.cid, e.perm, e.xperm) for e in self.core.queue], {k: (c.held, c.contended) for k, c in self.core.clients.items()}

            async def wait_waiting(self, n: int, timeout: float = 30.0) -> int:
                return await self.core.wait_waiting(n, timeout)

        _actor_cls = RateLimiterActor
    return _actor_cls


def actor_name(name: str) -> str:
    return ACTOR_PREFIX + name


def get_or_create_rate_limiter(name: str, max_concurrency: int, rate_per_second: float | None = None,
                               burst: int | None = None, *, detached: bool = False,
                               namespace: str = DEFAULT_NAMESPACE, **core_kwargs: Any):
    """Create (or get) the global limiter actor for resource `name`; returns the actor handle.

    Call it from the long-lived RolloutManager: by default the actor is owned by the calling
    process and lives exactly as long as it (it dies with the manager, not with some worker).
    `detached=True` makes it outlive its creator (until `kill_rate_limiter` or cluster shutdown);
    the tool uses that as a fallback when a worker finds no limiter the manager created.
    Asking again with a different limit raises `RateLimiterConfigError`: never silently ignored.
    """
    import ray

    want = LimiterCore(name, max_concurrency, rate_per_second, burst).config()
    opts: dict[str, Any] = dict(name=actor_name(name), namespace=namespace, get_if_exists=True,
                                max_concurrency=100_000)
    if detached:
        opts["lifetime"] = "detached"
    handle = _actor_class().options(**opts).remote(name, max_concurrency, rate_per_second, burst, core_kwargs)
    have = ray.get(handle.config.remote())
    if have != want:
        raise RateLimiterConfigError(
            f"rate limiter {name!r} already exists with {have}, asked for {want}; "
            "give each tool or service its own name, or use the same limits")
    # Ray garbage-collects a non-detached actor when its last handle goes: keep one here so the
    # limiter lives exactly as long as the process that created it (the manager).
    _owned.setdefault((namespace, name), handle)
    return handle


def get_rate_limiter(name: str, namespace: str = DEFAULT_NAMESPACE):
    """The existing limiter actor for `name`, or None (never creates one)."""
    import ray

    try:
        return ray.get_actor(actor_name(name), namespace=namespace)
    except ValueError as e:
        logger.debug("no rate limiter %s: %s", name, e)
        return None


def kill_rate_limiter(name: str, namespace: str = DEFAULT_NAMESPACE) -> bool:
    import ray

    h = get_rate_limiter(name, namespace)
    if h is None:
        return False
    ray.kill(h, no_restart=True)
    _clients.pop(name, None)
    _owned.pop((namespace, name), None)
    return True


# --------------------------------------------------------------------------------------------
# Backends: how a client talks to its core
# --------------------------------------------------------------------------------------------


class _LocalBackend:
    def __init__(self, core: LimiterCore) -> None:
        self.core = core

    def push(self, cid: str, kw: dict[str, int]) -> dict[str, int]:
        return self.core.push(cid, **kw)  # applied synchronously: nothing in flight

    async def poll(self, cid: str):
        return await self.core.poll(cid)

    async def unregister(self, cid: str, release: int, ret_tok: int, in_use: int | None = None) -> None:
        self.core.unregister(cid, release, ret_tok, in_use)

    async def stats(self) -> dict[str, Any]:
        return self.core.stats()

    async def config(self) -> dict[str, Any]:
        return self.core.config()


class _RayBackend:
    def __init__(self, handle) -> None:
        self.handle = handle

    def push(self, cid: str, kw: dict[str, int]) -> asyncio.Future:
        """Send; the returned future resolves when the actor has applied it."""
        ref = self.handle.push.remote(cid, kw)
        return asyncio.wrap_future(ref.future())

    async def poll(self, cid: str):
        return await self.handle.poll.remote(cid)

    async def unregister(self, cid: str, release: int, ret_tok: int, in_use: int | None = None) -> None:
        await self.handle.unregister.remote(cid, release, ret_tok, in_use)

    async def stats(self) -> dict[str, Any]:
        return await self.handle.stats.remote()

    async def config(self) -> dict[str, Any]:
        return await self.handle.config.remote()


# --------------------------------------------------------------------------------------------
# The per-process client
# --------------------------------------------------------------------------------------------


class RateLimiter:
    """Per-process (per event loop) client of one limiter. Use `limit()`:

        async with limiter.limit(timeout=30) as permit:
            resp = await call()
            if resp.status == 429:
                permit.throttled()
    """

    _ids = itertools.count()

    def __init__(self, backend, *, name: str = "", rate_limited: bool = True,
                 prefetch_tokens: int | None = None) -> None:
        self.backend = backend
        self.name = name
        self.cid = f"{os.getpid()}-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        self.rate_limited = rate_limited
        self._prefetch_tokens = prefetch_tokens if prefetch_tokens is not None else 0
        self.free = 0  # leased idle permits
        self.tokens = 0  # leased tokens
        self.inflight = 0
        self.n_waiting = 0
        self.waiters: deque[asyncio.Future] = deque()
        self.asked = 0  # permits requested and not yet received
        self.asked_tok = 0
        self.cancel_pending = 0  # withdrawals sent, not yet confirmed
        self.cancel_pending_tok = 0
        self.pledge = 0  # our oldest waiters the core let us serve with our own releases
        self.recycled = 0
        self.contended = False
        self.broken: BaseException | None = None
        self.closed = False
        self._kw: dict[str, int] = {}
        self._flush_scheduled = False
        self._push_inflight = False
        self._push_ack: asyncio.Future | None = None
        self._unregistering = False  # close(): no push may overtake (or be overtaken by) unregister
        self._poller: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # metrics
        self.granted = 0
        self.throttled_count = 0
        self.timeouts = 0
        self.cancelled = 0
        self.wait_total = 0.0
        self.wait_max = 0.0
        self.remote_messages = 0

    # -- public API ----------------------------------------------------------------------
    async def acquire(self, timeout: float | None = None) -> None:
        """Take one permit (and one token). Raises `RateLimitTimeout` after `timeout` seconds."""
        if self.broken is not None:
            raise RateLimiterUnavailable(f"rate limiter {self.name!r} is unavailable: {self.broken}")
        if self.closed:
            raise RuntimeError(f"rate limiter client {self.name!r} is closed")
        if (not self.n_waiting and self.free > 0 and not self.contended
                and (self.tokens > 0 or not self.rate_limited)):
            self.free -= 1
            if self.rate_limited:
                self.tokens -= 1
            self.inflight += 1
            self.granted += 1
            return
        loop = self._ensure_loop()
        fut = loop.create_future()
        self.waiters.append(fut)
        self.n_waiting += 1
        t0 = time.monotonic()
        timer = loop.call_later(timeout, self._expire, fut) if timeout is not None else None
        self._pump()
        try:
            await fut
        except BaseException:
            if fut.cancelled():  # our task was cancelled while waiting
                self.n_waiting -= 1
                self.cancelled += 1
            elif fut.exception() is None:
                self.release()  # granted in the race with the cancellation: give it back
            elif isinstance(fut.exception(), RateLimitTimeout):
                self.timeouts += 1
            self._pump()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        waited = time.monotonic() - t0
        self.wait_total += waited
        self.wait_max = max(self.wait_max, waited)

    def release(self, throttled: bool = False) -> None:
        """Give back one permit; `throttled=True` reports a 429 (AIMD cut), else a success."""
        if self.inflight <= 0:
            raise RuntimeError("release() without a matching acquire()")
        self.inflight -= 1
        if throttled:
            self.throttled_count += 1
            self._kw["throttled"] = self._kw.get("throttled", 0) + 1
            self._schedule_flush()
        else:
            self._kw["ok"] = self._kw.get("ok", 0) + 1
        if self.pledge > 0 and not throttled and not self.closed and self.broken is None and self._serve_one():
            # our callers are at the head of the FIFO (pledged): hand the permit over here
            self.pledge -= 1
            self.recycled += 1
            self._kw["recycled"] = self._kw.get("recycled", 0) + 1
            self._schedule_flush()
            return
        if self.contended or self.closed or self.broken is not None:
            self._kw["release"] = self._kw.get("release", 0) + 1
            self._schedule_flush()
            if self.n_waiting:
                self._pump()
        else:
            self.free += 1
            if self.n_waiting:
                self._pump()

    @contextlib.asynccontextmanager
    async def limit(self, timeout: float | None = None) -> AsyncIterator["_Permit"]:
        await self.acquire(timeout)
        p = _Permit()
        try:
            yield p
        finally:
            self.release(throttled=p.was_throttled)

    def stats(self) -> dict[str, Any]:
        return {"in_flight": self.inflight, "waiting": self.n_waiting, "leased_idle": self.free,
                "tokens": self.tokens if self.rate_limited else None, "granted": self.granted,
                "throttled_429": self.throttled_count, "timeouts": self.timeouts, "cancelled": self.cancelled,
                "wait_time_total_s": self.wait_total, "wait_time_max_s": self.wait_max,
                "contended": self.contended, "remote_messages": self.remote_messages, "pledged": self.pledge,
                "recycled": self.recycled}

    async def global_stats(self) -> dict[str, Any]:
        return await self.backend.stats()

    async def close(self) -> None:
        """Return every lease and leave. In-use permits are returned when released."""
        if self.closed:
            return
        self.closed = True
        for fut in self.waiters:
            if not fut.done():
                fut.set_exception(RuntimeError("rate limiter client closed"))
        self.waiters.clear()
        self.n_waiting = 0
        self.pledge = 0  # the core drops it on unregister
        if self._poller is not None:
            self._poller.cancel()
        # Ray does not promise to run an async actor's calls in submission order, and unregister
        # trusts `in_use`: let the message in flight land first, and send nothing until it is done.
        self._unregistering = True
        try:
            if self._push_ack is not None and not self._push_ack.done():
                await asyncio.wait({self._push_ack})
            release = self.free + self._kw.pop("release", 0)
            ret_tok = self.tokens if self.rate_limited else 0
            self.free = self.tokens = 0
            self._kw.clear()
            if self.broken is None:
                try:
                    await self.backend.unregister(self.cid, release, ret_tok, self.inflight)
                except Exception as e:  # actor gone: nothing to return to
                    logger.warning("rate limiter %s: unregister failed: %s", self.name, e)
        finally:
            self._unregistering = False
            self._schedule_flush()  # releases of permits still in use that came in meanwhile

    def _abandon(self) -> None:
        """Leave without an event loop (ours is closed): everything we held is given back,
        in-use permits included, since nothing in a closed loop can still be using them."""
        if self.closed:
            return
        self.closed = True
        release = self.free + self.inflight + self._kw.pop("release", 0)
        ret_tok = self.tokens if self.rate_limited else 0
        self.free = self.tokens = self.inflight = 0
        if self.broken is None and isinstance(self.backend, _RayBackend):
            try:
                self.backend.handle.unregister.remote(self.cid, release, ret_tok, 0)
            except Exception as e:  # noqa: BLE001
                logger.warning("rate limiter %s: could not hand back an abandoned lease: %s", self.name, e)

    # -- internals -----------------------------------------------------------------------
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("a RateLimiter client is bound to one event loop; use client_for() per loop")
        if self._poller is None or self._poller.done():
            if self.broken is None and not self.closed:
                self._poller = loop.create_task(self._poll_loop())
        return loop

    def _expire(self, fut: asyncio.Future) -> None:
        if not fut.done():
            self.n_waiting -= 1
            fut.set_exception(RateLimitTimeout(f"no permit from rate limiter {self.name!r} in time"))

    def _serve_one(self) -> bool:
        """Wake the oldest live waiter with a permit it now holds; False if nobody waits."""
        while self.waiters:
            fut = self.waiters.popleft()
            if fut.done():  # timed out or cancelled: already uncounted
                continue
            self.inflight += 1
            self.granted += 1
            self.n_waiting -= 1
            fut.set_result(None)
            return True
        return False

    def _pump(self) -> None:
        """Serve local waiters from leased permits, then reconcile demand with the core."""
        while self.free > 0 and (self.tokens > 0 or not self.rate_limited) and self._serve_one():
            self.free -= 1
            if self.rate_limited:
                self.tokens -= 1
        while self.waiters and self.waiters[0].done():
            self.waiters.popleft()
        live = self.n_waiting
        if self.closed or self.broken is not None:
            return
        # Waiters beyond the leased idle permits are covered by the pledge first (they are our
        # oldest), then by demand queued at the core. A pledge nobody needs any more (waiters
        # timed out or were served by grants) is handed back so the queue behind it moves on.
        uncovered = max(0, live - self.free)
        if self.pledge > uncovered:
            self._kw["unpledge"] = self._kw.get("unpledge", 0) + self.pledge - uncovered
            self.pledge = uncovered
            self._schedule_flush()
        uncovered -= self.pledge
        # `asked` counts demand sent and neither granted nor confirmed withdrawn; withdrawals on
        # their way (`cancel_pending`) are confirmed by the core with the exact amount applied,
        # so a withdrawal racing a grant is never counted twice.
        # (negative while a grant overtook the confirmation of a withdrawal it made moot)
        eff = max(0, self.asked - self.cancel_pending)
        eff_tok = max(0, self.asked_tok - self.cancel_pending_tok)
        need = max(0, uncovered - eff)
        need_tok = max(0, live - self.tokens - eff_tok) if self.rate_limited else 0
        if need or need_tok:
            kw = self._kw
            kw["need"] = kw.get("need", 0) + need
            kw["need_tok"] = kw.get("need_tok", 0) + need_tok
            if not self.contended:
                kw["want"] = kw.get("want", 0) + 2 * need
                kw["want_tok"] = kw.get("want_tok", 0) + need_tok + (self._prefetch_tokens if need_tok else 0)
            else:
                kw["want"] = kw.get("want", 0) + need
                kw["want_tok"] = kw.get("want_tok", 0) + need_tok
            self.asked += need
            self.asked_tok += need_tok
            eff += need
            eff_tok += need_tok
            self._schedule_flush()
        # more asked than anybody needs (waiters left): take the demand back
        surplus = eff - uncovered
        surplus_tok = eff_tok - max(0, live - self.tokens) if self.rate_limited else 0
        if surplus > 0 or surplus_tok > 0:
            self._kw["cancel"] = self._kw.get("cancel", 0) + max(0, surplus)
            self._kw["cancel_tok"] = self._kw.get("cancel_tok", 0) + max(0, surplus_tok)
            self.cancel_pending += max(0, surplus)
            self.cancel_pending_tok += max(0, surplus_tok)
            self._schedule_flush()
        if self.contended and (self.free > live or (self.rate_limited and self.tokens > live)):
            self._give_back_idle()

    def _give_back_idle(self) -> None:
        """Return what local waiters do not need (recall / contended mode)."""
        extra = self.free - self.n_waiting
        if extra > 0:
            self._kw["release"] = self._kw.get("release", 0) + extra
            self.free -= extra
        if self.rate_limited and self.tokens > self.n_waiting:
            self._kw["ret_tok"] = self._kw.get("ret_tok", 0) + self.tokens - self.n_waiting
            self.tokens = self.n_waiting
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and self._kw:
            self._flush_scheduled = True
            try:
                loop = self._loop or asyncio.get_running_loop()
            except RuntimeError:  # released outside any loop: flush now
                self._flush()
                return
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Send what accumulated. At most one message is in flight per client: while one is on
        its way, releases and demands pile up and leave together when it is acknowledged, so
        under contention batches grow by themselves (self-clocked, no timer)."""
        self._flush_scheduled = False
        if not self._kw or self.broken is not None or self._push_inflight or self._unregistering:
            return
        kw, self._kw = self._kw, {}
        kw = {k: v for k, v in kw.items() if v}
        if not kw:
            return
        kw["inflight"] = self.inflight
        kw["waiting"] = self.n_waiting
        self.remote_messages += 1
        try:
            ack = self.backend.push(self.cid, kw)
        except Exception as e:  # noqa: BLE001
            self._break(e)
            return
        sent = (kw.get("cancel", 0), kw.get("cancel_tok", 0))
        if isinstance(ack, dict):  # applied already (in-process core)
            self._confirm(sent, ack)
            self._pump()
            return
        self._push_inflight = True
        self._push_ack = ack
        ack.add_done_callback(lambda f: self._pushed(f, sent))

    def _confirm(self, sent: tuple[int, int], result: dict[str, int]) -> None:
        self.cancel_pending -= sent[0]
        self.cancel_pending_tok -= sent[1]
        self.asked = max(0, self.asked - result.get("cancelled", 0))
        self.asked_tok = max(0, self.asked_tok - result.get("cancelled_tok", 0))

    def _pushed(self, ack: asyncio.Future, sent: tuple[int, int]) -> None:
        self._push_inflight = False
        if ack.cancelled() or ack.exception() is not None:
            self._break(ack.exception() if not ack.cancelled() else RuntimeError("push cancelled"))
            return
        self._confirm(sent, ack.result())
        self._pump()  # the confirmation may leave demand nobody needs any more: withdraw it
        if self._kw:
            self._schedule_flush()

    async def _poll_loop(self) -> None:
        try:
            while not self.closed:
                m = await self.backend.poll(self.cid)
                self.remote_messages += 1
                contended = m["contended"]
                # prefetch does not answer demand; a pledge does (it is a grant to be served locally)
                self.asked = max(0, self.asked - m["pn"] - m["pledge"])
                self.asked_tok = max(0, self.asked_tok - m["tn"])
                perm = m["perm"]
                self.pledge += m["pledge"]
                if m["pp"]:  # permits for pledged callers, unless we served them already
                    take = min(m["pp"], self.pledge)
                    self.pledge -= take
                    stale = m["pp"] - take
                    if stale:  # the core counted them against the pledge: undo that
                        self._kw["restore"] = self._kw.get("restore", 0) + stale
                        if contended:  # keeping them would jump the queue: give them back
                            perm -= stale
                            self._kw["release"] = self._kw.get("release", 0) + stale
                        self._schedule_flush()
                if m["revoke"] and self.pledge:  # the waiters queue again (at the tail)
                    self._kw["unpledge"] = self._kw.get("unpledge", 0) + self.pledge
                    self.pledge = 0
                    self._schedule_flush()
                self.free += perm
                self.tokens += m["tok"]
                self.contended = contended
                self._pump()
                if m["recall"] or contended:
                    self._give_back_idle()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the actor died: fail loudly, never hang callers
            self._break(e)

    def _break(self, e: BaseException) -> None:
        logger.error("rate limiter %s unavailable: %r", self.name, e)
        self.broken = e
        for fut in self.waiters:
            if not fut.done():
                fut.set_exception(RateLimiterUnavailable(f"rate limiter {self.name!r} is unavailable: {e}"))
        self.waiters.clear()
        self.n_waiting = 0


class _Permit:
    __slots__ = ("was_throttled",)

    def __init__(self) -> None:
        self.was_throttled = False

    def throttled(self) -> None:
        """Report that the guarded call was answered 429 (the limiter cuts its rate)."""
        self.was_throttled = True


# --------------------------------------------------------------------------------------------
# Factories
# --------------------------------------------------------------------------------------------

_clients: dict[str, dict[int, RateLimiter]] = {}


def local_rate_limiter(max_concurrency: int, rate_per_second: float | None = None, burst: int | None = None,
                       name: str = "local", **core_kwargs: Any) -> RateLimiter:
    """A process-local limiter with the same API and semantics (no Ray needed)."""
    core = LimiterCore(name, max_concurrency, rate_per_second, burst, **core_kwargs)
    return RateLimiter(_LocalBackend(core), name=name, rate_limited=core.base_rate is not None,
                       prefetch_tokens=_token_prefetch(core.base_rate))


def _token_prefetch(rate: float | None) -> int:
    # Tokens are leased exactly as needed (batched per tick), so the burst bound is exact: every
    # token in use left the core's bucket, which never holds more than `burst`. Prefetching
    # tokens (RateLimiter(prefetch_tokens=k)) saves round trips at very high rates but lets a
    # process spend up to k tokens above `burst` in a spike.
    return 0


def client_for(name: str, handle=None, namespace: str = DEFAULT_NAMESPACE) -> RateLimiter:
    """This process's client (one per event loop) of the global limiter `name`.

    `handle` is the actor handle (from `get_or_create_rate_limiter`); without it the actor is
    looked up by name and must exist.
    """
    loop = asyncio.get_running_loop()
    per_loop = _clients.setdefault(name, {})
    c = per_loop.get(id(loop))
    if c is not None and c.broken is None and not c.closed and c._loop in (None, loop):
        return c
    # A client whose event loop is gone (e.g. one asyncio.run() per step) can never answer a
    # recall: hand its leases back now instead of letting the core wait for lease_ttl.
    for key, old in list(per_loop.items()):
        if old._loop is None or old._loop.is_closed() or old._loop is loop:
            old._abandon()
            per_loop.pop(key, None)
    if handle is None:
        handle = get_rate_limiter(name, namespace)
        if handle is None:
            raise RateLimiterUnavailable(f"no global rate limiter named {name!r}: the manager creates it "
                                         "with get_or_create_rate_limiter()")
    import ray

    cfg = ray.get(handle.config.remote())
    c = RateLimiter(_RayBackend(handle), name=name, rate_limited=cfg["rate_per_second"] is not None,
                    prefetch_tokens=_token_prefetch(cfg["rate_per_second"]))
    c._loop = loop
    per_loop[id(loop)] = c
    return c
