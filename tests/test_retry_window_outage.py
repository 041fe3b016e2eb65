"""A sample's window for finding a live engine counts from the fault, not from its first attempt (issue 31):
requests that waited long on a loaded engine before the node holding every engine was lost still get the
whole `--request-retry-window` for the replacement, and refusals while no engine exists do not spend their
count of retries. Bounded: with no replacement, they fail once the window from the fault has passed.

Deterministic, no timing thresholds: the fleet's pool is published through a real `Fleet` (stand-in slots),
requests go through the real `EngineClient` to a stand-in router, and the clock the retry window reads is
moved by the test (the requests "waited" 10 windows on the loaded engine; the replacement comes half a window
after the fault). The replacement is held until every request has been refused more times than its retry
count allows while the pool was empty.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.fleet.engine_slot import EngineSlot
from slime.fleet.fleet import Fleet
from slime.rollout.engine_client import EngineClient
from slime.utils import endpoints as endpoints_module
from slime.utils import http_retry
from slime.utils.http_retry import HttpError, RetryPolicy
from tests.fleet_configs import fleet_config

N = 8  # requests in flight when the engine's node is lost
WINDOW = 60.0
MAX_RETRIES = 3
REFUSALS = MAX_RETRIES + 2  # refusals each request gets while the pool is empty, before the replacement serves


class Clock:
    """The retry window's clock: real time plus what the test adds."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset


class Router:
    """A stand-in sglang-router: holds the first attempts on the (loaded) engine until all N are in, answers
    them 502 when the engine dies under them, refuses with 503 while no engine exists, then serves."""

    def __init__(self) -> None:
        self.all_in = asyncio.Event()
        self.engine_died = asyncio.Event()
        self.serving = asyncio.Event()
        self.arrived = 0
        self.refused: dict[int, int] = {}
        self.waiting = asyncio.Event()  # each request refused REFUSALS times while the pool was empty

    async def generate(self, request: web.Request) -> web.Response:
        i = (await request.json())["i"]
        if not self.engine_died.is_set():
            self.arrived += 1
            if self.arrived == N:
                self.all_in.set()
            await self.engine_died.wait()
            return web.Response(status=502, text="worker connection lost")
        if not self.serving.is_set():
            self.refused[i] = self.refused.get(i, 0) + 1
            if len(self.refused) == N and min(self.refused.values()) >= REFUSALS:
                self.waiting.set()
            return web.Response(status=503, text="no available workers")
        return web.json_response({"i": i})


async def _until(event: asyncio.Event, calls: list[asyncio.Task], bound: float = 300.0) -> None:
    """Wait for `event`, or for every call to have ended (they gave up: nothing left to wait for)."""
    waiter = asyncio.create_task(event.wait())
    await asyncio.wait(
        [waiter, asyncio.gather(*calls, return_exceptions=True)], timeout=bound, return_when=asyncio.FIRST_COMPLETED
    )
    waiter.cancel()


async def _scenario(monkeypatch, replacement_comes: bool) -> tuple[list, Router]:
    clock = Clock()
    monkeypatch.setattr(http_retry, "time", clock)
    monkeypatch.setattr(endpoints_module, "time", clock, raising=False)
    router = Router()
    app = web.Application()
    app.router.add_post("/generate", router.generate)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # noqa: SLF001 - the port picked
    fleet = Fleet(fleet_config("--engine-startup-timeout", "30"))
    slot = EngineSlot(0, [None], [0], url="http://127.0.0.1:9", state="healthy")
    fleet.slots = [slot]
    fleet.endpoints.router_url = url
    fleet.publish()
    client = EngineClient(fleet.endpoints, request_timeout=600.0)
    client.retry_policy = RetryPolicy(max_retries=MAX_RETRIES, window=WINDOW, base_delay=0.001, max_delay=0.01)
    try:
        calls = [asyncio.create_task(client.post(f"{url}/generate", {"i": i})) for i in range(N)]
        await _until(router.all_in, calls)
        clock.offset += 10 * WINDOW  # they waited 10 windows on the loaded engine before it was lost
        slot.state = "dead"  # what the fleet does when the last engine dies
        fleet.publish()
        router.engine_died.set()
        await _until(router.waiting, calls)  # the replacement is held until every request is waiting for it
        if replacement_comes:
            clock.offset += WINDOW / 2  # it took half a window after the fault
            slot.state = "healthy"
            fleet.publish()
            router.serving.set()
        else:
            clock.offset += 2 * WINDOW
        results = await asyncio.gather(*calls, return_exceptions=True)
    finally:
        await client.http.close()
        await runner.cleanup()
    return results, router


def test_requests_started_long_before_the_fault_wait_for_the_replacement_within_the_window(monkeypatch):
    results, router = asyncio.run(_scenario(monkeypatch, replacement_comes=True))
    assert sorted(r["i"] for r in results if isinstance(r, dict)) == list(range(N)), results
    assert min(router.refused.values()) >= REFUSALS > MAX_RETRIES  # refusals with no engine spent no retries


def test_with_no_replacement_they_fail_once_the_window_from_the_fault_has_passed(monkeypatch):
    results, router = asyncio.run(_scenario(monkeypatch, replacement_comes=False))
    assert min(router.refused.values(), default=0) >= REFUSALS  # they waited for a replacement first
    assert all(isinstance(r, HttpError) for r in results), results
    assert {r.reason for r in results} == {"http_502"}  # the cause: the engine lost under them


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=12))
def test_the_window_starts_at_the_last_change_of_the_pool(counts):
    """Whatever the fleet publishes, `since` moves exactly when the pool empties or comes back, forward."""
    clock = Clock()
    outage = endpoints_module.Endpoints().outage
    empty, since = False, None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(endpoints_module, "time", clock, raising=False)
        for n in counts:
            clock.offset += 10.0
            outage.published(n)
            if (n == 0) != empty:
                empty = n == 0
                assert since is None or outage.since >= since + 10.0
                since = outage.since
            assert outage.since == since and outage.empty == empty
