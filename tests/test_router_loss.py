"""Requests in flight on a router whose node died are cut as soon as the fleet knows it moved, and retried
at its new address (issue 24): on a real network a dead host resets no connection, so without this each
would wait for --request-timeout. The dead router here is a server that takes the request and never answers."""

from __future__ import annotations

import asyncio
import threading

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from slime.rollout.engine_client import EngineClient
from slime.utils.endpoints import Endpoints
from slime.utils.http_retry import HttpError
from slime.utils.router_loss import RouterLost, RouterLosses
from tests.fleet_configs import fleet_config

BOUND_S = 60.0  # every wait of these tests; a request's own deadline is far beyond it


def _router(answers: bool, arrived: threading.Event | None = None) -> web.Application:
    """A router that answers `{"text": "ok"}`, or one whose host is gone: it takes requests and never answers."""

    async def generate(request: web.Request) -> web.Response:
        if not answers:
            if arrived is not None:
                arrived.set()
            await asyncio.Event().wait()
        return web.json_response({"text": "ok", "rid": (await request.json())["rid"]})

    app = web.Application()
    app.router.add_post("/generate", generate)
    return app


def _url(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


async def test_a_request_on_a_router_that_moved_is_cut_and_answered_at_the_new_address():
    arrived = threading.Event()
    async with (
        TestServer(_router(False, arrived), host="127.0.0.1") as dead,
        TestServer(_router(True), host="127.0.0.1") as moved,
    ):
        dead_url, moved_url = _url(dead), _url(moved)
        endpoints = Endpoints(dead_url, [])
        client = EngineClient(endpoints, request_timeout=3600.0)
        retried = []

        def renew(payload, failure):
            retried.append(failure)
            return {**payload, "rid": "r2"}

        def fleet_moves_the_router() -> None:  # the fleet's thread, once the request waits on the dead router
            assert arrived.wait(BOUND_S), "the request never reached the dead router"
            endpoints.router_url = moved_url
            endpoints.router_losses.lost(dead_url, "its node was lost")

        mover = threading.Thread(target=fleet_moves_the_router)
        mover.start()
        answer = await asyncio.wait_for(
            client.post(lambda: f"{endpoints.router_url}/generate", {"rid": "r1"}, on_retry=renew), BOUND_S
        )
        mover.join(BOUND_S)
        await client.close()
    assert answer == {"text": "ok", "rid": "r2"}
    [failure] = retried
    assert (failure.reason, failure.may_still_run) == ("router_lost", True)
    assert failure.detail == f"router at {dead_url} is gone: its node was lost"
    assert dict(client.stats.retries) == {"router_lost": 1} and client.stats.failures == 0


async def test_an_attempt_on_an_address_already_known_gone_fails_at_once_with_the_reason():
    async with TestServer(_router(False), host="127.0.0.1") as dead:
        dead_url = _url(dead)
        endpoints = Endpoints(dead_url, [])
        endpoints.router_losses.lost(f"{dead_url}/", "its node was lost")
        client = EngineClient(endpoints, request_timeout=3600.0, max_retries=0)
        with pytest.raises(HttpError) as err:
            await asyncio.wait_for(client.post(f"{dead_url}/generate", {"rid": "r1"}), BOUND_S)
        await client.close()
    assert err.value.reason == "router_lost"
    assert f"cause: router_lost: router at {dead_url} is gone: its node was lost" in str(err.value)


async def test_a_watched_block_that_ends_before_the_loss_is_left_alone_and_other_addresses_are_not_cut():
    losses = RouterLosses()
    async with losses.watch("http://127.0.0.1:1/generate"):
        pass
    losses.lost("http://127.0.0.1:1", "gone")
    await asyncio.sleep(0)  # a late notice would cancel this task here
    async with losses.watch("http://127.0.0.1:2/generate"):  # another router: not cut
        await asyncio.sleep(0)
    with pytest.raises(RouterLost, match="router at http://127.0.0.1:1 is gone: gone"):
        async with losses.watch("http://127.0.0.1:1/health"):
            pass


def test_the_fleet_cuts_the_old_routers_requests_when_it_publishes_the_new_address(monkeypatch):
    from slime.fleet import fleet as fleet_module
    from slime.fleet import lost_nodes

    monkeypatch.setattr(lost_nodes, "node_alive", lambda node: False)  # Ray says: node n1 is gone
    fleet = fleet_module.Fleet(fleet_config())
    fleet._publish_router("http://10.0.0.5:30000")
    fleet._router_moved("n1", "n2", "http://127.0.0.1:30001")
    assert fleet.endpoints.router_url == "http://127.0.0.1:30001" and fleet.counters["router_moves"] == 1
    assert fleet.counters["nodes_lost"] == 1

    async def attempt_on_the_old_router() -> None:
        async with fleet.endpoints.router_losses.watch("http://10.0.0.5:30000/generate"):
            pass

    with pytest.raises(RouterLost) as err:
        asyncio.run(attempt_on_the_old_router())
    assert str(err.value) == (
        "router at http://10.0.0.5:30000 is gone: its node n1 was lost; the router serves "
        "at http://127.0.0.1:30001 on node n2 now"
    )
    # a later router at that address again (a node back with its IP, the same port): its requests go through
    fleet._router_moved(None, "n1", "http://10.0.0.5:30000")
    asyncio.run(attempt_on_the_old_router())
    assert fleet.counters["router_moves"] == 2
