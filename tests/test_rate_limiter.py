"""The cluster-wide rate limiter: cap, rate, FIFO, no leaks, AIMD, Ray multi-process and multi-node."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from slime.tools.rate_limiter import (LimiterCore, RateLimiter, RateLimiterConfigError, RateLimitTimeout,
                                      _LocalBackend, local_rate_limiter)

ROOT = Path(__file__).resolve().parents[1]


def _clients(core: LimiterCore, n: int) -> list[RateLimiter]:
    return [RateLimiter(_LocalBackend(core), name=core.name, rate_limited=core.base_rate is not None)
            for _ in range(n)]


class Probe:
    """Counts concurrent holders (the 'sandbox' view of in-flight calls)."""

    def __init__(self) -> None:
        self.cur = self.max = self.n = 0

    def enter(self) -> None:
        self.cur += 1
        self.n += 1
        self.max = max(self.max, self.cur)

    def exit(self) -> None:
        self.cur -= 1


# ----------------------------------------------------------------------------------- local
async def test_cap_holds_across_clients_of_one_core():
    core = LimiterCore("t", 5)
    clients = _clients(core, 3)
    probe = Probe()

    async def call(c: RateLimiter) -> None:
        async with c.limit(timeout=10):
            probe.enter()
            await asyncio.sleep(random.random() * 0.003)
            probe.exit()

    await asyncio.gather(*[call(clients[i % 3]) for i in range(600)])
    assert probe.max == 5 and probe.n == 600
    assert all(c.inflight == 0 and c.n_waiting == 0 for c in clients)
    for c in clients:
        await c.close()
    assert core.stats()["leased"] == 0


async def test_rate_limit_holds():
    rate, burst = 200.0, 5
    lim = local_rate_limiter(1000, rate_per_second=rate, burst=burst)
    stamps: list[float] = []

    async def call() -> None:
        async with lim.limit(timeout=10):
            stamps.append(time.monotonic())

    await asyncio.gather(*[call() for _ in range(105)])
    # in every window, grants <= burst + rate * window (+1 for the token in progress)
    stamps.sort()
    for i in range(len(stamps)):
        for j in range(i + 1, len(stamps)):
            window = stamps[j] - stamps[i]
            assert j - i + 1 <= burst + rate * window + 1, (i, j, window)
    assert stamps[-1] - stamps[0] >= (105 - burst - 1) / rate * 0.95


async def test_fifo_order_local():
    lim = local_rate_limiter(1)
    await lim.acquire()
    order: list[int] = []

    async def waiter(i: int) -> None:
        async with lim.limit(timeout=10):
            order.append(i)

    tasks = []
    for i in range(20):
        tasks.append(asyncio.ensure_future(waiter(i)))
        await asyncio.sleep(0)  # let waiter i enqueue before i+1
    lim.release()
    await asyncio.gather(*tasks)
    assert order == list(range(20))


async def test_timeout_and_cancellation_do_not_leak():
    core = LimiterCore("t", 2)
    a, b = _clients(core, 2)
    await a.acquire()
    await a.acquire()
    with pytest.raises(RateLimitTimeout):
        await b.acquire(timeout=0.05)
    t = asyncio.ensure_future(b.acquire())
    await asyncio.sleep(0.01)
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    # a permit granted in the same tick as the cancellation is given back, not lost
    t2 = asyncio.ensure_future(b.acquire())
    await asyncio.sleep(0.01)
    a.release()
    t2.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t2
    a.release()
    await asyncio.sleep(0.01)
    assert b.inflight == 0 and b.n_waiting == 0 and a.inflight == 0
    # full capacity is still there
    await b.acquire(timeout=1)
    await b.acquire(timeout=1)
    assert b.inflight == 2
    b.release()
    b.release()
    assert b.stats()["timeouts"] == 1 and b.stats()["cancelled"] == 2
    await a.close()
    await b.close()
    s = core.stats()
    assert s["leased"] == 0 and s["waiting"] == 0


async def test_rotten_execution_local():
    lim = local_rate_limiter(3)

    async def rotten(i: int) -> None:
        async with lim.limit(timeout=5):
            await asyncio.sleep(0)
            raise RuntimeError(f"boom {i}")

    res = await asyncio.gather(*[rotten(i) for i in range(50)], return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in res)
    assert lim.inflight == 0 and lim.n_waiting == 0
    for _ in range(3):
        await lim.acquire(timeout=1)  # the whole cap is available again
    for _ in range(3):
        lim.release()


async def test_aimd_cuts_on_429_and_recovers():
    core = LimiterCore("t", 16, cut_cooldown=0.0)
    (c,) = _clients(core, 1)
    async with c.limit() as p:
        p.throttled()
    await asyncio.sleep(0.01)
    assert core.cap == 8 and core.stats()["throttled_429"] == 1
    async with c.limit() as p:
        p.throttled()
    await asyncio.sleep(0.01)
    assert core.cap == 4
    probe = Probe()

    async def call() -> None:
        async with c.limit(timeout=10):
            probe.enter()
            await asyncio.sleep(0)
            probe.exit()

    await asyncio.gather(*[call() for _ in range(12)])
    assert probe.max <= 5  # the cut holds (4, +1 if additive increase already kicked in)
    for _ in range(40):
        await asyncio.gather(*[call() for _ in range(32)])
    await asyncio.sleep(0.01)
    assert core.cap == 16 and core.factor == 1.0  # recovered additively


async def test_close_while_holding_keeps_the_cap():
    core = LimiterCore("t", 2)
    a, b = _clients(core, 2)
    await a.acquire()
    await a.acquire()
    await a.close()  # misuse: closing with permits in use; they still count against the cap
    with pytest.raises(RateLimitTimeout):
        await b.acquire(timeout=0.05)
    a.release()
    await b.acquire(timeout=1)
    a.release()
    await asyncio.sleep(0.01)
    b.release()
    await b.close()
    assert core.stats()["leased"] == 0 and "clients" in core.stats() and not core.clients


async def _start_waiters(c: RateLimiter, tags: list[str], order: list[str], hold: float = 0.001) -> list:
    async def one(tag: str) -> None:
        async with c.limit(timeout=10):
            order.append(tag)
            await asyncio.sleep(hold)

    tasks = []
    for t in tags:
        tasks.append(asyncio.ensure_future(one(t)))
        await asyncio.sleep(0)  # each caller's demand reaches the core before the next one's
    return tasks


async def test_pledge_recycles_locally_in_fifo_order():
    """The head of the FIFO holds permits: it serves its own queued callers with its releases
    (no message per hand-over), and callers queued behind it from elsewhere wait their turn."""
    core = LimiterCore("t", 2)
    a, b = _clients(core, 2)
    await a.acquire()
    await a.acquire()
    order: list[str] = []
    tasks = await _start_waiters(a, ["a1", "a2", "a3"], order)
    await asyncio.sleep(0.001)
    assert a.stats()["pledged"] == 3 and core.stats()["waiting"] == 3
    tasks += await _start_waiters(b, ["b1", "b2", "b3"], order)
    msgs = a.remote_messages
    a.release()
    a.release()
    await asyncio.gather(*tasks)
    assert order == ["a1", "a2", "a3", "b1", "b2", "b3"]
    assert a.stats()["recycled"] >= 2 and b.stats()["recycled"] >= 1
    assert a.remote_messages - msgs <= 4
    for c in (a, b):
        await c.close()
    s = core.stats()
    assert s["leased"] == 0 and s["waiting"] == 0 and s["pledged"] == 0 and not core.pledges


async def test_permits_freed_elsewhere_go_to_the_pledge_first():
    core = LimiterCore("t", 2)
    a, b = _clients(core, 2)
    await a.acquire()
    await b.acquire()
    order: list[str] = []
    tasks = await _start_waiters(a, ["a1", "a2"], order, hold=0.05)  # head of the FIFO, pledged (a holds one)
    tasks += await _start_waiters(b, ["b1"], order)
    b.release()  # freed elsewhere: goes to a's pledged callers, not to b1 (who came later)
    await asyncio.sleep(0.005)
    assert order == ["a1"]
    a.release()  # recycled locally to a2
    await asyncio.gather(*tasks)
    assert order == ["a1", "a2", "b1"]
    for c in (a, b):
        await c.close()
    s = core.stats()
    assert s["leased"] == 0 and s["waiting"] == 0 and not core.pledges


async def test_pledged_waiter_timeout_and_cancel_do_not_leak():
    core = LimiterCore("t", 1)
    a, b = _clients(core, 2)
    await a.acquire()
    t1 = asyncio.ensure_future(a.acquire(timeout=0.02))  # pledged, then times out
    t2 = asyncio.ensure_future(a.acquire())  # pledged, then cancelled
    await asyncio.sleep(0.001)
    assert a.stats()["pledged"] == 2
    tb = asyncio.ensure_future(b.acquire(timeout=5))
    with pytest.raises(RateLimitTimeout):
        await t1
    t2.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t2
    await asyncio.sleep(0.001)
    assert a.stats()["pledged"] == 0 and not core.pledges  # handed back: the queue moves on
    a.release()
    await tb  # b gets the permit
    b.release()
    for c in (a, b):
        await c.close()
    s = core.stats()
    assert s["leased"] == 0 and s["waiting"] == 0


async def test_aimd_cut_revokes_the_pledge():
    core = LimiterCore("t", 16, cut_cooldown=0.0)
    a, b = _clients(core, 2)
    for _ in range(16):
        await a.acquire()
    tasks = [asyncio.ensure_future(a.acquire(timeout=5)) for _ in range(3)]
    await asyncio.sleep(0.001)
    assert a.stats()["pledged"] == 3
    a.release(throttled=True)  # cap 16 -> 8 while 15 are still in use: stop recycling
    await asyncio.sleep(0.005)
    assert core.cap == 8 and a.stats()["pledged"] == 0
    in_use, waiting = a.inflight, a.n_waiting  # (the 429'd permit itself may have been reused locally)
    assert in_use > 8 and waiting >= 2
    for _ in range(3):
        a.release()
    await asyncio.sleep(0.005)
    assert a.inflight == in_use - 3 and a.n_waiting == waiting  # nothing handed over above the new cap
    for _ in range(in_use - 3):
        a.release()
    await asyncio.gather(*tasks)
    for _ in range(waiting):
        a.release()
    await asyncio.sleep(0.005)
    for c in (a, b):
        await c.close()
    assert core.stats()["leased"] == 0


async def test_dead_pledge_holder_is_reclaimed():
    """A process that dies holding a pledge must not hold up the queue forever (even when it
    was already in contended mode, so it gets no fresh recall)."""
    core = LimiterCore("t", 2, lease_ttl=0.2)
    a, b = _clients(core, 2)
    await a.acquire()
    await b.acquire()
    go = asyncio.Event()

    async def b_caller() -> None:
        async with b.limit():
            await go.wait()

    tb = asyncio.ensure_future(b_caller())  # b heads the queue: pledged; a turns contended
    await asyncio.sleep(0.001)
    ta = asyncio.ensure_future(a.acquire())  # queued behind b's pledge
    await asyncio.sleep(0.001)
    t = asyncio.ensure_future(b.acquire(timeout=5))  # queued behind a
    await asyncio.sleep(0.001)
    assert b.stats()["pledged"] == 1 and a.contended
    b.release()  # recycled to b's caller; then a heads the queue and holds a permit: pledged
    await asyncio.sleep(0.002)
    assert a.stats()["pledged"] == 1 and core.pledges == {a.cid: None} and a.contended
    a._poller.cancel()  # a's process "dies": it never answers again
    await asyncio.sleep(0.001)
    go.set()  # b's permit goes to the (dead) pledge first ...
    await asyncio.wait_for(t, 2)  # ... and is reclaimed after lease_ttl
    await tb
    assert core.stats()["pledged"] == 0
    b.release()
    ta.cancel()
    await b.close()


def test_core_rejects_bad_config():
    with pytest.raises(ValueError):
        LimiterCore("t", 0)


# ------------------------------------------------------------------------------------ Ray
@pytest.fixture(scope="module")
def ray_env(ray_cluster):
    import ray

    @ray.remote(num_cpus=0)
    class Worker:
        """A separate process using the limiter by name, as a rollout worker would."""

        async def info(self, name):
            from slime.tools.rate_limiter import get_rate_limiter

            h = get_rate_limiter(name)
            return None if h is None else (h._actor_id.hex(), await h.config.remote(), os.getpid())

        async def recreate(self, name, cap, rate=None, burst=None):
            from slime.tools.rate_limiter import get_or_create_rate_limiter

            try:
                get_or_create_rate_limiter(name, cap, rate, burst)
                return "ok"
            except RateLimiterConfigError as e:
                return f"error: {e}"

        async def hammer(self, name, probe, n_callers, n_calls, hold_s):
            from slime.tools.rate_limiter import client_for

            lim = client_for(name)

            async def caller():
                for _ in range(n_calls):
                    async with lim.limit(timeout=60):
                        await probe.enter.remote()
                        await asyncio.sleep(hold_s)
                        await probe.exit.remote()

            await asyncio.gather(*[caller() for _ in range(n_callers)])
            st = lim.stats()
            await lim.close()
            return st

        async def rotten(self, name, n):
            from slime.tools.rate_limiter import client_for

            lim = client_for(name)

            async def bad():
                async with lim.limit(timeout=60):
                    await asyncio.sleep(0.001)
                    raise ValueError("rotten")

            res = await asyncio.gather(*[bad() for _ in range(n)], return_exceptions=True)
            st = lim.stats()
            await lim.close()
            return sum(isinstance(r, ValueError) for r in res), st

        async def ordered(self, name, i, recorder):
            from slime.tools.rate_limiter import client_for

            lim = client_for(name)
            async with lim.limit(timeout=60):
                await recorder.log.remote(i)
            return i

        async def cancel_one(self, name):
            from slime.tools.rate_limiter import client_for

            lim = client_for(name)
            t = asyncio.ensure_future(lim.acquire())
            await asyncio.sleep(0.2)
            t.cancel()
            try:
                await t
            except asyncio.CancelledError:
                pass
            await asyncio.sleep(0.05)
            return lim.stats()

    @ray.remote(num_cpus=0)
    class ProbeActor:
        def __init__(self):
            self.cur = self.max = self.n = 0
            self.log_ = []

        def enter(self):
            self.cur += 1
            self.n += 1
            self.max = max(self.max, self.cur)

        def exit(self):
            self.cur -= 1

        def log(self, i):
            self.log_.append(i)

        def get(self):
            return {"cur": self.cur, "max": self.max, "n": self.n, "log": self.log_}

    workers = [Worker.remote() for _ in range(2)]
    ray.get([w.__ray_ready__.remote() for w in workers])
    return ray, workers, ProbeActor


def test_basic_multi_process_init(ray_env):
    ray, workers, _ = ray_env
    from slime.tools.rate_limiter import get_or_create_rate_limiter, kill_rate_limiter

    h = get_or_create_rate_limiter("mp-init", 7, rate_per_second=100, burst=10)
    infos = ray.get([w.info.remote("mp-init") for w in workers])
    assert len({i[2] for i in infos}) == 2  # two other processes ...
    assert {i[0] for i in infos} == {h._actor_id.hex()}  # ... see one actor
    assert all(i[1]["max_concurrency"] == 7 and i[1]["rate_per_second"] == 100 for i in infos)
    # same limits: fine; different limit: an error, not silently ignored
    assert ray.get(workers[0].recreate.remote("mp-init", 7, 100, 10)) == "ok"
    out = ray.get(workers[0].recreate.remote("mp-init", 8))
    assert out.startswith("error:") and "already exists" in out
    with pytest.raises(RateLimiterConfigError):
        get_or_create_rate_limiter("mp-init", 7)  # the rate differs (none asked)
    # one actor per resource name
    h2 = get_or_create_rate_limiter("mp-init-other", 3)
    assert h2._actor_id != h._actor_id
    assert kill_rate_limiter("mp-init") and kill_rate_limiter("mp-init-other")
    assert ray.get(workers[1].info.remote("mp-init")) is None


class TestSingleNodeRateLimiterCase:
    def test_cap_holds_across_processes(self, ray_env):
        ray, workers, ProbeActor = ray_env
        from slime.tools.rate_limiter import get_or_create_rate_limiter, kill_rate_limiter

        get_or_create_rate_limiter("single-node", 4)
        probe = ProbeActor.remote()
        stats = ray.get([w.hammer.remote("single-node", probe, 6, 8, 0.005) for w in workers])
        p = ray.get(probe.get.remote())
        assert p["n"] == 2 * 6 * 8 and p["cur"] == 0
        assert p["max"] <= 4, p  # never above the cap, seen by the guarded resource
        assert p["max"] >= 3, p  # and the cap was actually reached (the test is not vacuous)
        assert all(s["in_flight"] == 0 and s["waiting"] == 0 for s in stats)
        kill_rate_limiter("single-node")

    def test_cap_holds_with_many_queued_callers_per_process(self, ray_env):
        """Both processes always have callers queued: permits are handed over locally under a
        pledge (recycled) and between processes through the actor; the cap still holds."""
        ray, workers, ProbeActor = ray_env
        from slime.tools.rate_limiter import get_or_create_rate_limiter, kill_rate_limiter

        h = get_or_create_rate_limiter("single-node-crowd", 4)
        probe = ProbeActor.remote()
        stats = ray.get([w.hammer.remote("single-node-crowd", probe, 64, 4, 0.0) for w in workers])
        p = ray.get(probe.get.remote())
        assert p["n"] == 2 * 64 * 4 and p["cur"] == 0
        assert 3 <= p["max"] <= 4, p
        assert all(s["in_flight"] == 0 and s["waiting"] == 0 for s in stats)
        assert sum(s["recycled"] for s in stats) > 0, stats
        s = ray.get(h.stats.remote())
        assert s["leased"] == 0 and s["waiting"] == 0 and s["pledged"] == 0, s
        kill_rate_limiter("single-node-crowd")

    def test_sandbox_sees_the_cap(self, ray_env):
        """The real thing: the tool in two processes, the sandbox counts concurrent runs."""
        ray, _, _ = ray_env
        import requests

        from slime.sandbox.server import start_local_sandbox
        from slime.tools.rate_limiter import get_or_create_rate_limiter, kill_rate_limiter

        url, handle = start_local_sandbox(max_concurrency=8)
        try:
            get_or_create_rate_limiter("tool:code_interpreter_cap", 3)

            @ray.remote(num_cpus=0)
            class ToolWorker:
                async def run(self, url, n):
                    from slime.tools.sandbox_fusion_tool import SandboxFusionTool
                    from slime.tools.schemas import OpenAIFunctionToolSchema

                    schema = OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {
                        "name": "code_interpreter_cap", "parameters": {"type": "object", "properties": {
                            "code": {"type": "string"}}, "required": ["code"]}}})
                    tool = SandboxFusionTool({"sandbox_fusion_url": url, "rate_limit": 3}, schema)
                    iid, _ = await tool.create()
                    res = await asyncio.gather(*[tool.execute(iid, {"code": "import time; time.sleep(0.15); print('ok')"})
                                                 for _ in range(n)])
                    return [r[0].text for r in res]

            ws = [ToolWorker.remote() for _ in range(2)]
            outs = ray.get([w.run.remote(url, 6) for w in ws])
            assert all(t == "ok\n" for o in outs for t in o), outs
            st = requests.get(url + "/v1/stats").json()
            assert st["total"] == 12 and st["running"] == 0
            assert st["max_running"] <= 3, st
            assert st["max_running"] >= 2, st
        finally:
            kill_rate_limiter("tool:code_interpreter_cap")
            handle.stop()


def test_rotten_execution(ray_env):
    ray, workers, _ = ray_env
    from slime.tools.rate_limiter import get_or_create_rate_limiter, kill_rate_limiter

    h = get_or_create_rate_limiter("rotten", 2)
    res = ray.get([w.rotten.remote("rotten", 20) for w in workers])
    assert all(n == 20 and st["in_flight"] == 0 and st["waiting"] == 0 for n, st in res)
    s = ray.get(h.stats.remote())
    assert s["leased"] == 0 and s["in_flight"] == 0 and s["waiting"] == 0, s
    kill_rate_limiter("rotten")


def test_fifo_across_processes(ray_env):
    ray, workers, ProbeActor = ray_env
    from slime.tools.rate_limiter import client_for, get_or_create_rate_limiter, kill_rate_limiter

    h = get_or_create_rate_limiter("fifo", 1)
    rec = ProbeActor.remote()

    async def go():
        lim = client_for("fifo", h)
        await lim.acquire()  # hold the only permit
        refs = []
        for i in range(8):
            refs.append(workers[i % 2].ordered.remote("fifo", i, rec))
            await h.wait_waiting.remote(i + 1)  # waiter i is queued before waiter i+1 comes
        lim.release()
        await asyncio.gather(*refs)
        await lim.close()

    asyncio.run(go())
    assert ray.get(rec.get.remote())["log"] == list(range(8))
    kill_rate_limiter("fifo")


def test_cancellation_does_not_leak_across_processes(ray_env):
    ray, workers, _ = ray_env
    from slime.tools.rate_limiter import client_for, get_or_create_rate_limiter, kill_rate_limiter

    h = get_or_create_rate_limiter("cancel", 1)

    async def go():
        lim = client_for("cancel", h)
        await lim.acquire()
        st = await workers[0].cancel_one.remote("cancel")  # waits, then is cancelled
        assert st["in_flight"] == 0 and st["waiting"] == 0 and st["cancelled"] == 1
        lim.release()
        await lim.close()
        # the permit is free: another process gets it at once
        out = await workers[1].rotten.remote("cancel", 1)
        assert out[0] == 1
        s = await h.stats.remote()
        assert s["waiting"] == 0 and s["in_flight"] == 0

    asyncio.run(go())
    kill_rate_limiter("cancel")


def test_abandoned_event_loop_hands_its_lease_back(ray_env):
    """One asyncio.run() per step (a common driver pattern) must not strand permits."""
    ray, _, _ = ray_env
    from slime.tools.rate_limiter import client_for, get_or_create_rate_limiter, kill_rate_limiter

    h = get_or_create_rate_limiter("abandon", 2)

    async def step(release: bool):
        lim = client_for("abandon", h)
        await lim.acquire(timeout=5)
        await lim.acquire(timeout=5)
        if release:
            lim.release()
            lim.release()
            await lim.close()

    t0 = time.monotonic()
    asyncio.run(step(release=False))  # the loop dies with both permits in use
    asyncio.run(step(release=True))  # a new loop: the dead client's lease is handed back at once
    assert time.monotonic() - t0 < 5
    s = ray.get(h.stats.remote())
    assert s["leased"] == 0 and s["waiting"] == 0, s
    kill_rate_limiter("abandon")


def test_manager_prepares_sandbox_and_limiter(ray_env, monkeypatch):
    """What the RolloutManager calls for `sandbox_fusion_url: local` + the global limiter."""
    import requests
    import yaml

    from slime.tools.rate_limiter import get_rate_limiter, kill_rate_limiter
    from slime.tools.sandbox_fusion_tool import SandboxFusionTool, prepare_sandbox_services
    from slime.tools.schemas import OpenAIFunctionToolSchema

    monkeypatch.delenv("SLIME_SANDBOX_URL", raising=False)
    entries = yaml.safe_load((ROOT / "configs" / "sandbox_fusion_tool.yaml").read_text())["tools"]
    entries[0]["config"]["limiter_name"] = "prepared"
    svc = prepare_sandbox_services(entries)
    try:
        assert os.environ["SLIME_SANDBOX_URL"] == svc["sandbox_url"]
        assert requests.get(svc["sandbox_url"] + "/v1/ping").text == "pong"
        h = svc["limiters"]["prepared"]
        assert get_rate_limiter("prepared")._actor_id == h._actor_id
        schema = OpenAIFunctionToolSchema.model_validate(entries[0]["tool_schema"])
        tool = SandboxFusionTool(entries[0]["config"], schema)  # finds the manager's limiter
        assert tool._handle._actor_id == h._actor_id and tool._url is None
        with pytest.raises(RateLimiterConfigError):
            SandboxFusionTool({**entries[0]["config"], "rate_limit": 99}, schema)
    finally:
        svc["sandbox"].stop()
        kill_rate_limiter("prepared")
        monkeypatch.delenv("SLIME_SANDBOX_URL", raising=False)


MULTINODE = textwrap.dedent("""
    import asyncio, json, os, sys
    sys.path.insert(0, {root!r})
    import ray
    from ray.cluster_utils import Cluster
    from slime.tools.rate_limiter import get_or_create_rate_limiter

    cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 1, "resources": {{"node_a": 4}},
                      "include_dashboard": False}})
    cluster.add_node(num_cpus=1, resources={{"node_b": 4}})
    ray.init(address=cluster.address, log_to_driver=False,
             runtime_env={{"env_vars": {{"PYTHONPATH": {root!r}, "RAY_AUTH_MODE": "disabled"}}}})
    cluster.wait_for_nodes()
    get_or_create_rate_limiter("multi-node", 3)

    @ray.remote(num_cpus=0)
    class P:
        def __init__(self): self.cur = self.max = self.n = 0
        def enter(self): self.cur += 1; self.n += 1; self.max = max(self.max, self.cur)
        def exit(self): self.cur -= 1
        def get(self): return dict(cur=self.cur, max=self.max, n=self.n)

    @ray.remote(num_cpus=0)
    class W:
        async def run(self, probe, n, k):
            from slime.tools.rate_limiter import client_for
            lim = client_for("multi-node")
            async def c():
                for _ in range(k):
                    async with lim.limit(timeout=60):
                        await probe.enter.remote(); await asyncio.sleep(0.005); await probe.exit.remote()
            await asyncio.gather(*[c() for _ in range(n)])
            st = lim.stats(); await lim.close()
            return ray.get_runtime_context().get_node_id(), st

    probe = P.remote()
    ws = [W.options(resources={{"node_a": 1}}).remote(), W.options(resources={{"node_b": 1}}).remote()]
    res = ray.get([w.run.remote(probe, 5, 8) for w in ws])
    print(json.dumps({{"nodes": len({{r[0] for r in res}}), "probe": ray.get(probe.get.remote()),
                      "inflight": [r[1]["in_flight"] for r in res]}}))
    ray.shutdown(); cluster.shutdown()
""")


class TestMultiNodeRateLimiterCase:
    def test_cap_holds_across_nodes(self, tmp_path):
        import json

        env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
                   PYTHONPATH=str(ROOT))
        p = subprocess.run([sys.executable, "-c", MULTINODE.format(root=str(ROOT))], env=env,
                           capture_output=True, text=True, timeout=240)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        assert p.returncode == 0 and lines, p.stderr[-3000:]
        out = json.loads(lines[-1])
        assert out["nodes"] == 2
        assert out["probe"]["n"] == 2 * 5 * 8 and out["probe"]["cur"] == 0
        assert out["probe"]["max"] <= 3, out
        assert out["probe"]["max"] >= 2, out
        assert out["inflight"] == [0, 0]
