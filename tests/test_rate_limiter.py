"""The cluster-wide rate limiter: exact cap, FIFO, rate, AIMD, timeouts, close, dead clients, a dead actor.

Synchronisation is by events (a gate the holders wait on) or by polling state with a deadline,
never by sleeping; no assertion is about speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import pytest

from slime.tools.rate_limiter import (
    LimiterCore,
    RateLimiter,
    RateLimiterConfigError,
    RateLimiterUnavailable,
    RateLimitTimeout,
    local_rate_limiter,
)


@contextlib.asynccontextmanager
async def permit(lim: RateLimiter, timeout: float = 30, throttled: bool = False):
    """Hold one permit for the block and give it back on every exit path, as a 429 (`throttled`) or not."""
    await lim.acquire(timeout)
    try:
        yield
    finally:
        lim.release(throttled=throttled)


async def eventually(check, what: str, timeout: float = 20.0) -> None:
    """Poll `check()` (sync or async) until true; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        ok = check()
        if asyncio.iscoroutine(ok):
            ok = await ok
        if ok:
            return
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        await asyncio.sleep(0.002)


def clients(core: LimiterCore, n: int) -> list[RateLimiter]:
    return [RateLimiter(core, core.name) for _ in range(n)]


class Holders:
    """The guarded resource's view: callers inside now and at most; `gate` keeps them inside."""

    def __init__(self) -> None:
        self.now = self.max = self.total = 0
        self.order: list = []
        self.opened = asyncio.Event()

    async def hold(self, lim: RateLimiter, tag=None, gated: bool = True, throttled: bool = False) -> None:
        async with permit(lim, throttled=throttled):
            self.now += 1
            self.total += 1
            self.max = max(self.max, self.now)
            self.order.append(tag)
            if gated:
                await self.opened.wait()
            else:
                await asyncio.sleep(0)
            self.now -= 1


# --------------------------------------------------------------------------------- one process
async def test_cap_is_exact_across_clients_of_one_core():
    core = LimiterCore("t", 5)
    cs = clients(core, 3)
    h = Holders()
    gated = [asyncio.ensure_future(h.hold(cs[i % 3])) for i in range(12)]
    await eventually(lambda: h.now == 5 and core.stats()["waiting"] == 7, "5 inside, 7 queued")
    assert h.max == 5
    h.opened.set()
    await asyncio.gather(*gated)
    await asyncio.gather(*[h.hold(cs[i % 3], gated=False) for i in range(600)])
    assert h.max == 5 and h.total == 612
    assert all(c.inflight == 0 and not c.waiters for c in cs)
    for c in cs:
        c.close()
    assert core.stats()["leased"] == 0 and not core.clients


async def test_fifo_across_clients():
    core = LimiterCore("t", 1)
    a, b = clients(core, 2)
    await a.acquire()
    h = Holders()
    h.opened.set()
    tasks = []
    for i in range(10):
        tasks.append(asyncio.ensure_future(h.hold((a, b)[i % 2], tag=i)))
        await eventually(lambda: core.stats()["waiting"] == i + 1, f"waiter {i} queued")
    a.release()
    await asyncio.gather(*tasks)
    assert h.order == list(range(10))


async def test_rate_and_burst_hold():
    rate, burst, n = 100.0, 5, 40
    lim = local_rate_limiter(1000, rate_per_second=rate, burst=burst)
    stamps: list[float] = []

    async def call() -> None:
        async with permit(lim):
            stamps.append(time.monotonic())

    await asyncio.gather(*[call() for _ in range(n)])
    # in every window: grants <= burst + rate * window (+1: the token being earned)
    for i in range(n):
        for j in range(i + 1, n):
            assert j - i + 1 <= burst + rate * (stamps[j] - stamps[i]) + 1, (i, j)
    assert (await lim.global_stats())["leased"] == 0


async def test_timeout_leaves_nothing_held():
    core = LimiterCore("t", 2)
    a, b = clients(core, 2)
    await a.acquire()
    await a.acquire()
    with pytest.raises(RateLimitTimeout):
        await b.acquire(timeout=0.05)
    assert not b.waiters and b.inflight == 0
    await eventually(lambda: core.stats()["waiting"] == 0, "the timed-out ticket withdrawn")
    a.release()
    a.release()
    await b.acquire(timeout=5)
    await b.acquire(timeout=5)  # the whole cap is there
    assert b.inflight == 2


async def test_cancellation_leaves_nothing_held():
    core = LimiterCore("t", 1)
    a, b = clients(core, 2)
    await a.acquire()
    t = asyncio.ensure_future(b.acquire())
    await eventually(lambda: core.stats()["waiting"] == 1, "b queued")
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert not b.waiters and b.inflight == 0
    # served in the same tick as the cancellation: the permit is given back, not lost
    a.release()
    await b.acquire(timeout=5)
    t = asyncio.ensure_future(b.acquire())
    await eventually(lambda: b.tickets and b.tickets[0] == b.head and b.hand_over, "b's ticket at the head")
    b.release()  # handed over to the waiter right here ...
    t.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await t
    assert b.inflight == 0 and not b.waiters
    await a.acquire(timeout=5)
    a.release()
    for c in (a, b):
        c.close()
    assert core.stats()["leased"] == 0 and core.stats()["waiting"] == 0


async def test_errors_inside_release_the_permit():
    lim = local_rate_limiter(3)

    async def rotten(i: int) -> None:
        async with permit(lim, timeout=5):
            await asyncio.sleep(0)
            raise RuntimeError(f"boom {i}")

    res = await asyncio.gather(*[rotten(i) for i in range(50)], return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in res)
    assert lim.inflight == 0 and not lim.waiters
    for _ in range(3):
        await lim.acquire(timeout=5)


async def test_aimd_halves_on_429_and_recovers_additively():
    core = LimiterCore("t", 16, cut_cooldown=0.0)
    (c,) = clients(core, 1)
    h = Holders()
    h.opened.set()
    await h.hold(c, gated=False, throttled=True)
    await eventually(lambda: core.cap == 8, "first cut")
    await h.hold(c, gated=False, throttled=True)
    await eventually(lambda: core.cap == 4, "second cut")
    assert core.stats()["throttled_429"] == 2 and core.stats()["aimd_cuts"] == 2

    async def gated_phase(n: int, cap: int) -> None:
        g = Holders()
        tasks = [asyncio.ensure_future(g.hold(c)) for _ in range(n)]
        await eventually(lambda: g.now == cap and core.stats()["waiting"] == n - cap, f"{cap} inside")
        assert g.max == cap
        g.opened.set()
        await asyncio.gather(*tasks)

    await gated_phase(12, 4)  # the cut holds
    while core.factor < 1.0:  # +1 permit per `cap` successes
        await asyncio.gather(*[h.hold(c, gated=False) for _ in range(32)])
    assert core.cap == 16 and h.total < 16 * 16
    await gated_phase(24, 16)  # recovered


async def test_close_gives_everything_back_and_fails_waiters():
    core = LimiterCore("t", 2)
    a, b = clients(core, 2)
    await a.acquire()
    await a.acquire()
    waiting = asyncio.ensure_future(a.acquire())
    await eventually(lambda: core.stats()["waiting"] == 1, "a's third caller queued")
    a.close()  # e.g. its event loop is gone: the permits in use go back too
    with pytest.raises(RateLimiterUnavailable):
        await waiting
    assert core.stats()["leased"] == 0 and core.stats()["waiting"] == 0 and a.cid not in core.clients
    await b.acquire(timeout=5)
    await b.acquire(timeout=5)  # the whole cap
    with pytest.raises(RateLimiterUnavailable):
        await a.acquire()
    a.release()  # a late release of a closed client changes nothing
    assert core.stats()["leased"] == 2


async def test_silent_client_is_reaped_after_lease_ttl():
    core = LimiterCore("t", 2, lease_ttl=0.2)
    a, b = clients(core, 2)
    await a.acquire()
    await a.acquire()
    a.poller.cancel()  # it stops reading its mail, as if its process had died holding both permits
    await b.acquire(timeout=10)  # b queues, a is woken, never answers, is reaped
    assert core.stats()["leased"] == 1 and a.cid not in core.clients
    # a was only asleep: it learns its permits were taken, and fails its callers instead of hanging them
    a.poller = asyncio.ensure_future(a._poll_forever())
    await eventually(lambda: a.broken is not None, "a learns it was reaped")
    with pytest.raises(RateLimiterUnavailable):
        await a.acquire()


async def test_calls_of_a_client_that_left_are_void():
    """Ray may run one client's calls out of order: a message overtaken by its `leave` must not revive it."""
    core = LimiterCore("t", 2)
    core.push("c1", {"leave": True})
    core.push("c1", {"need": 2})
    assert await core.poll("c1") == {"gone": True}
    assert core.stats()["waiting"] == 0 and core.stats()["leased"] == 0 and not core.clients


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="max_concurrency"):
        LimiterCore("t", 0)


# ---------------------------------------------------------------------------- across processes
@pytest.fixture(scope="module")
def ray_env(ray_cluster):
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class Probe:
        """The guarded resource, in its own process: holders now and at most, a gate, an order log."""

        def __init__(self):
            self.now = self.max = self.total = 0
            self.order = []
            self.opened = asyncio.Event()

        async def enter(self, tag=None):
            self.now += 1
            self.total += 1
            self.max = max(self.max, self.now)
            if tag is not None:
                self.order.append(tag)

        async def exit(self):
            self.now -= 1

        async def gate(self):
            await self.opened.wait()

        async def open(self):
            self.opened.set()

        async def get(self):
            return {"now": self.now, "max": self.max, "total": self.total, "order": self.order}

    @ray.remote(num_cpus=0)
    class Worker:
        """Another process using the limiter by name, as a rollout worker does."""

        async def info(self, name):
            from slime.tools.rate_limiter import get_rate_limiter

            h = get_rate_limiter(name)
            return None if h is None else (h._actor_id.hex(), await h.config.remote(), os.getpid())

        async def create(self, name, cap, rate=None, burst=None):
            from slime.tools.rate_limiter import get_or_create_rate_limiter

            try:
                get_or_create_rate_limiter(name, cap, rate, burst)
                return "ok"
            except RateLimiterConfigError as e:
                return f"error: {e}"

        async def call(self, name, probe, n_callers=1, n_calls=1, gated=False, tag=None, rotten=False):
            from slime.tools.rate_limiter import client_for

            lim = client_for(name)

            async def caller():
                for _ in range(n_calls):
                    await lim.acquire(timeout=60)
                    try:
                        await probe.enter.remote(tag)
                        if gated:
                            await probe.gate.remote()
                        await probe.exit.remote()
                        if rotten:
                            raise ValueError("rotten: the permit must still be released")
                    except ValueError:
                        pass
                    finally:
                        lim.release()

            await asyncio.gather(*[caller() for _ in range(n_callers)])
            return {"in_flight": lim.inflight, "waiting": lim.n_waiting, "handed_over": lim.handed_over}

        async def acquire_outcome(self, name, timeout=None):
            from slime.tools.rate_limiter import client_for

            try:
                lim = client_for(name)
                await lim.acquire(timeout)
            except (RateLimitTimeout, RateLimiterUnavailable) as e:
                return type(e).__name__
            lim.release()
            return "ok"

    workers = [Worker.remote() for _ in range(2)]
    ray.get([w.__ray_ready__.remote() for w in workers])
    return ray, workers, Probe


def test_one_actor_per_name_and_limits_never_silently_change(ray_env):
    ray, workers, _ = ray_env
    from slime.tools.rate_limiter import get_or_create_rate_limiter, get_rate_limiter, kill_rate_limiter

    h = get_or_create_rate_limiter("rl-init", 7, rate_per_second=100, burst=10)
    h2 = get_or_create_rate_limiter("rl-init-other", 3)
    try:
        infos = ray.get([w.info.remote("rl-init") for w in workers])
        assert len({i[2] for i in infos} | {os.getpid()}) == 3  # three processes ...
        assert {i[0] for i in infos} == {h._actor_id.hex()}  # ... one actor
        assert infos[0][1] == {"name": "rl-init", "max_concurrency": 7, "rate_per_second": 100.0, "burst": 10}
        assert ray.get(workers[0].create.remote("rl-init", 7, 100, 10)) == "ok"
        out = ray.get(workers[0].create.remote("rl-init", 8))
        assert out.startswith("error:") and "already exists" in out
        with pytest.raises(RateLimiterConfigError):
            get_or_create_rate_limiter("rl-init", 7)  # no rate asked: differs
        assert h2._actor_id != h._actor_id
    finally:
        assert kill_rate_limiter("rl-init") and kill_rate_limiter("rl-init-other")
    asyncio.run(eventually(lambda: get_rate_limiter("rl-init") is None, "the name is free again"))


def test_cap_is_exact_across_processes(ray_env):
    ray, workers, Probe = ray_env
    from slime.tools.rate_limiter import get_or_create_rate_limiter, kill_rate_limiter

    h = get_or_create_rate_limiter("rl-cap", 4)
    try:
        probe = Probe.remote()
        gated = [w.call.remote("rl-cap", probe, n_callers=4, gated=True) for w in workers]

        async def four_in_four_queued():
            return (await probe.get.remote())["now"] == 4 and (await h.stats.remote())["waiting"] == 4

        asyncio.run(eventually(four_in_four_queued, "4 holders, 4 queued"))
        assert ray.get(probe.get.remote())["max"] == 4  # exactly the cap, seen by the resource
        ray.get(probe.open.remote())
        ray.get(gated)
        probe = Probe.remote()  # many callers per process, some calls raising
        stats = ray.get(
            [w.call.remote("rl-cap", probe, n_callers=16, n_calls=4, rotten=(i == 1)) for i, w in enumerate(workers)]
        )
        p = ray.get(probe.get.remote())
        assert p["total"] == 2 * 16 * 4 and p["now"] == 0 and p["max"] <= 4, p
        assert all(s["in_flight"] == 0 and s["waiting"] == 0 for s in stats), stats
        assert sum(s["handed_over"] for s in stats) > 0, stats  # hand-overs without a round trip happened
        s = ray.get(h.stats.remote())
        assert s["waiting"] == 0 and s["leased"] <= 4, s
    finally:
        kill_rate_limiter("rl-cap")


def test_fifo_across_processes(ray_env):
    ray, workers, Probe = ray_env
    from slime.tools.rate_limiter import client_for, get_or_create_rate_limiter, kill_rate_limiter

    h = get_or_create_rate_limiter("rl-fifo", 1)
    probe = Probe.remote()

    async def go():
        lim = client_for("rl-fifo", h)
        await lim.acquire()  # hold the only permit
        refs = []
        for i in range(8):
            refs.append(workers[i % 2].call.remote("rl-fifo", probe, tag=i))

            async def queued(n=i + 1):
                return (await h.stats.remote())["waiting"] == n

            await eventually(queued, f"waiter {i} queued")
        lim.release()
        await asyncio.gather(*refs)
        lim.close()

    try:
        asyncio.run(go())
        assert ray.get(probe.get.remote())["order"] == list(range(8))
    finally:
        kill_rate_limiter("rl-fifo")


def test_timeout_across_processes(ray_env):
    ray, workers, _ = ray_env
    from slime.tools.rate_limiter import client_for, get_or_create_rate_limiter, kill_rate_limiter

    h = get_or_create_rate_limiter("rl-timeout", 1)

    async def go():
        lim = client_for("rl-timeout", h)
        await lim.acquire()
        assert await workers[0].acquire_outcome.remote("rl-timeout", 0.2) == "RateLimitTimeout"
        lim.release()
        lim.close()
        assert await workers[1].acquire_outcome.remote("rl-timeout", 30) == "ok"  # nothing leaked
        await eventually(lambda: _stats_match(h, waiting=0), "queue empty")

    try:
        asyncio.run(go())
    finally:
        kill_rate_limiter("rl-timeout")


async def _stats_match(handle, **want) -> bool:
    s = await handle.stats.remote()
    return all(s[k] == v for k, v in want.items())


def test_killed_actor_raises_unavailable(ray_env):
    ray, workers, _ = ray_env
    from slime.tools.rate_limiter import client_for, get_or_create_rate_limiter, kill_rate_limiter

    h = get_or_create_rate_limiter("rl-kill", 1)

    async def go():
        lim = client_for("rl-kill", h)
        await lim.acquire()
        waiting = workers[0].acquire_outcome.remote("rl-kill")  # queued behind us
        await eventually(lambda: _stats_match(h, waiting=1), "the worker queued")
        assert kill_rate_limiter("rl-kill")
        assert await waiting == "RateLimiterUnavailable"  # a waiting caller fails, it does not hang
        await eventually(lambda: lim.broken is not None, "our client notices")
        with pytest.raises(RateLimiterUnavailable):
            await lim.acquire()
        assert await workers[1].acquire_outcome.remote("rl-kill") == "RateLimiterUnavailable"  # no actor by name
        with pytest.raises(RateLimiterUnavailable):
            client_for("rl-kill")

    asyncio.run(go())


def test_abandoned_event_loop_hands_its_lease_back(ray_env):
    """One asyncio.run() per step (a common driver pattern) must not strand permits."""
    ray, _, _ = ray_env
    from slime.tools.rate_limiter import client_for, get_or_create_rate_limiter, kill_rate_limiter

    h = get_or_create_rate_limiter("rl-abandon", 2, lease_ttl=600)

    async def step(finish: bool):
        lim = client_for("rl-abandon", h)
        await lim.acquire(timeout=30)
        await lim.acquire(timeout=30)  # without the hand-back this waits for lease_ttl, and times out
        if finish:
            lim.release()
            lim.release()
            lim.close()

    try:
        asyncio.run(step(finish=False))  # the loop dies with both permits in use
        asyncio.run(step(finish=True))
        asyncio.run(eventually(lambda: _stats_match(h, leased=0, waiting=0), "all permits back"))
    finally:
        kill_rate_limiter("rl-abandon")


def test_sandbox_sees_the_cap(ray_env):
    """The real thing: the sandbox tool in two processes; the sandbox counts concurrent runs."""
    ray, _, _ = ray_env
    import requests

    from slime.sandbox.server import start_local_sandbox
    from slime.tools.rate_limiter import get_or_create_rate_limiter, kill_rate_limiter

    url, sandbox = start_local_sandbox(max_concurrency=8)
    try:
        handle = get_or_create_rate_limiter("tool:code_interpreter_cap", 3)  # noqa: F841 - keeps the actor

        @ray.remote(num_cpus=0)
        class ToolWorker:
            async def run(self, url, n):
                from slime.tools.sandbox_fusion_tool import SandboxFusionTool
                from slime.tools.schemas import OpenAIFunctionToolSchema

                schema = OpenAIFunctionToolSchema.model_validate(
                    {
                        "type": "function",
                        "function": {
                            "name": "code_interpreter_cap",
                            "parameters": {
                                "type": "object",
                                "properties": {"code": {"type": "string"}},
                                "required": ["code"],
                            },
                        },
                    }
                )
                tool = SandboxFusionTool({"sandbox_fusion_url": url, "rate_limit": 3}, schema)
                iid, _ = await tool.create()
                code = "import time; time.sleep(0.1); print('ok')"  # the sandboxed workload
                res = await asyncio.gather(*[tool.execute(iid, {"code": code}) for _ in range(n)])
                return [r[0].text for r in res]

        outs = ray.get([w.run.remote(url, 5) for w in [ToolWorker.remote() for _ in range(2)]])
        assert all(t == "ok\n" for o in outs for t in o), outs
        st = requests.get(url + "/v1/stats").json()
        assert st["total"] == 10 and st["running"] == 0 and st["max_running"] <= 3, st
    finally:
        kill_rate_limiter("tool:code_interpreter_cap")
        sandbox.stop()
