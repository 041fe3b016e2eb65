"""A cancelled agent turn (its client went away, its session finished) is aborted where it was, as
`EngineClient` aborts any request it gives up: through the real sglang-router the closed connection
is the abort and only the engine that had the turn hears of it (no `/abort_request` at all); sent to
a known engine, that engine gets exactly one. Never one abort per engine of the fleet."""

from __future__ import annotations

import asyncio
import threading

import pytest

from slime.agent.gateway.engine_call import EngineTurns
from slime.rollout.engine_client import EngineClient
from slime.utils.endpoints import Endpoints


class HangUntilAborted:
    """Every engine's script: a request hangs until it is aborted (by rid or by its client leaving)."""

    def __init__(self):
        self.arrived = threading.Event()
        self.aborted = threading.Event()
        self.rids: list[str] = []

    async def __call__(self, body, aborted: asyncio.Event):
        self.rids.append(body["rid"])
        self.arrived.set()
        await aborted.wait()
        self.aborted.set()
        return {"output_ids": [], "finish_type": "abort", "text": ""}


def cancel_a_turn(client: EngineClient, script: HangUntilAborted) -> None:
    """Start one turn, cancel it once an engine has it, and wait for the cancellation to complete."""

    async def go():
        turn = asyncio.ensure_future(
            EngineTurns(client).generate([1, 2, 3], {"max_new_tokens": 4}, routing_key="session-1")
        )
        try:
            assert await asyncio.to_thread(script.arrived.wait, 30), "no engine received the turn"
            turn.cancel()
            with pytest.raises(asyncio.CancelledError):
                await turn
        finally:
            await client.close()

    asyncio.run(go())


def test_a_cancelled_turn_behind_the_router_is_aborted_only_by_the_engine_that_had_it(fleet_of):
    script = HangUntilAborted()
    router, engines = fleet_of(script, 3)
    client = EngineClient(Endpoints(router.url, [e.url for e in engines]), request_timeout=60.0, vocab_size=64)
    cancel_a_turn(client, script)
    assert script.aborted.wait(30), "the engine that had the turn never learnt its client went away"
    assert [e.aborts for e in engines] == [[], [], []]  # no /abort_request, to any engine
    assert sorted(e.disconnects for e in engines) == [[], [], script.rids]  # the one that had it
    assert len(script.rids) == 1 and script.rids[0].startswith("slime-")
    assert (client.disconnect_aborts, client.abort_stats.requests) == (1, 0)


def test_a_cancelled_turn_sent_to_a_known_engine_gets_one_abort_request_there(fleet_of):
    script = HangUntilAborted()
    _, engines = fleet_of(script, 3)
    known = engines[1]
    client = EngineClient(Endpoints(known.url, [e.url for e in engines]), request_timeout=60.0, vocab_size=64)
    cancel_a_turn(client, script)
    assert [e.aborts for e in engines] == [[], [{"rid": script.rids[0]}], []]  # sent before the cancel completed
    assert script.aborted.wait(30)
    assert (client.disconnect_aborts, client.abort_stats.requests, client.abort_stats.failures) == (0, 1, 0)
