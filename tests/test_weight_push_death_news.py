"""A push learns of an engine's death from two pieces of news that arrive in any order: its call failing
without an answer (Ray: "the actor died") and its exit notice (the fleet's supervised actor). On a
multi-raylet cluster a survivor's refusal may come first too (its collective reset by the lost peer).
Whatever the order, the lost engine is named dead (EnginesDied: the group re-forms with the survivors),
never a plain failure of the whole push (issue 24: a node lost during a push)."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest
import requests

from slime.weights.engine_calls import gather
from slime.weights.engine_deaths import EnginesDied, WeightSyncError
from slime.weights.group import WeightUpdateGroup

LATE_S = 0.3  # how long after its call failed the lost engine's exit notice arrives (a loaded Ray cluster)


class Engine:
    """A stand-in engine with an exit notice; `lost`: its calls fail without an answer, and its exit
    notice arrives only LATE_S after (on a timer started by the failure, so the order is fixed)."""

    def __init__(self, name: str, lost: bool = False, refuses: bool = False):
        self.name, self.lost, self.refuses = name, lost, refuses
        self.exited: cf.Future = cf.Future()

    def __repr__(self) -> str:
        return self.name

    def call(self) -> dict:
        if self.lost:
            threading.Timer(LATE_S, self.exited.set_result, args=(-9,)).start()
            raise RuntimeError("The actor died unexpectedly before finishing this task")
        if self.refuses:
            raise requests.HTTPError(f"{self.name}: HTTP 500: ring receive failed: Connection reset by peer")
        return {"success": True}

    init_weights_update_group = update_weights_from_distributed = lambda self, **_: self.call()

    def destroy_weights_update_group(self, **_) -> dict:
        return {"success": True}


def _settle(future: cf.Future, engine: Engine) -> None:
    try:
        future.set_result(engine.call())
    except Exception as exc:  # noqa: BLE001 - the call's failure, as a thread would hand it over
        future.set_exception(exc)


def _calls(engines: list[Engine], survivor_first: bool) -> list[cf.Future]:
    """Each engine's call as a future. `survivor_first`: the others are settled now and the lost engine's
    call fails only LATE_S later, while the push already handles the survivor's refusal (news: refusal,
    the lost call's failure, its exit notice); else the lost engine's failure is in first."""
    futures = [cf.Future() for _ in engines]
    for f, e in zip(futures, engines):
        if e.lost and survivor_first:
            threading.Timer(LATE_S, _settle, args=(f, e)).start()
        else:
            _settle(f, e)
    return futures


@pytest.mark.parametrize("survivor_first", [True, False])
def test_a_lost_engine_is_named_dead_whatever_news_comes_first(survivor_first):
    survivor, lost = Engine("engine 0", refuses=True), Engine("engine 1", lost=True)
    with pytest.raises(EnginesDied) as err:
        gather([survivor, lost], _calls([survivor, lost], survivor_first), "update_weights_from_distributed", 30)
    assert err.value.dead == [lost]
    assert "engine 1 died" in str(err.value)


def test_a_refusal_without_a_death_is_still_a_failure_naming_the_engine():
    a, b = Engine("engine 0", refuses=True), Engine("engine 1")
    with pytest.raises(WeightSyncError) as err:
        gather([a, b], _calls([a, b], True), "update_weights_from_distributed", 30)
    assert not isinstance(err.value, EnginesDied)
    assert "failed on 1 of 2 engines: engine 0: engine 0: HTTP 500" in str(err.value)


def test_group_formation_names_an_engine_lost_while_a_survivor_refuses():
    """A survivor refuses to join (its peer is gone) while the lost engine is still joining: its exit
    notice is awaited, and formation drops it instead of failing."""
    lost_joins = threading.Event()
    survivor, lost = Engine("engine 0", refuses=True), Engine("engine 1", lost=True)

    def join_then_die(**_):  # still joining when the survivor refuses; dies once the refusal is in
        lost_joins.wait(10)
        return lost.call()

    lost.init_weights_update_group = join_then_die
    survivor_call = survivor.call

    def refuse(**_):
        try:
            return survivor_call()
        finally:
            lost_joins.set()

    survivor.init_weights_update_group = refuse
    group = WeightUpdateGroup([survivor, lost], group_name="g-news", timeout=5, transport="broadcast")
    with pytest.raises(EnginesDied) as err:
        group._connect_once()  # noqa: SLF001 - one formation attempt; connect() would retry with the survivor
    assert err.value.dead == [lost]
