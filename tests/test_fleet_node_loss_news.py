"""A node loss named when it happens (issue 31): when an engine's actor dies the fleet asks Ray about its node
until Ray decides; a lost node is recorded at once (in the rollout running), every engine it held is out of the
router and `dead` in `status()` at once (not when each one's own death reaches the fleet), each is reported
dead once, and a replacement that fails before it serves is worded as a re-placement, not a second death.
An actor killed on a live node is not a node loss. Stand-in actors on the suite's Ray; the real thing on a
multi-raylet cluster: tests/test_multinode_preemption.py."""

from __future__ import annotations

import logging

import pytest
from tests.fleet_configs import fleet_config

GONE = "f" * 56  # a node id Ray does not know: not alive


class Placeholder:
    """Stands for an engine actor."""

    def ping(self) -> bool:
        return True


@pytest.fixture
def fleet(ray_cluster, monkeypatch):
    """A fleet of three engines: 0 and 1 on a node that is gone, 2 on this live node; restarts recorded,
    not run."""
    ray = ray_cluster
    from slime.fleet.fleet import EngineSlot, Fleet

    fleet = Fleet(fleet_config("--engine-startup-timeout", "30"))
    here = ray.get_runtime_context().get_node_id()
    actors = [ray.remote(Placeholder).options(num_cpus=0).remote() for _ in range(3)]
    fleet.slots = [
        EngineSlot(0, [actors[0]], [0], url="http://127.0.0.1:7", state="healthy", node_id=GONE),
        EngineSlot(1, [actors[1]], [1], url="http://127.0.0.1:8", state="healthy", node_id=GONE),
        EngineSlot(2, [actors[2]], [2], url="http://127.0.0.1:9", state="healthy", node_id=here),
    ]
    fleet.publish()
    restarted: list[int] = []
    monkeypatch.setattr(fleet.supervisor, "_restart", lambda slot: restarted.append(slot.rank))
    monkeypatch.setattr(fleet, "unregister", lambda url: None)
    fleet.restarted = restarted
    yield fleet
    for a in actors:
        ray.kill(a)


def test_a_lost_node_takes_every_engine_it_held_out_at_once_and_is_named(fleet, caplog):
    with caplog.at_level(logging.WARNING, logger="slime.fleet"):
        fleet.supervisor.on_death(fleet.slots[0], "actor died (ActorDiedError)", actor=fleet.slots[0].actor)
        # engine 1's own death has not reached the fleet yet: it is out all the same
        assert [s.state for s in fleet.slots] == ["dead", "dead", "healthy"]
        assert fleet.endpoints.engine_urls == ["http://127.0.0.1:9"]
        assert fleet.counters["nodes_lost"] == 1 and fleet.counters["engine_deaths"] == 1
        [lost] = fleet.lost_node_status()
        assert lost["node_id"] == GONE and lost["engines"] == [0, 1]
        fleet.supervisor.on_death(fleet.slots[1], "actor died (ActorDiedError)", actor=fleet.slots[1].actor)
    assert fleet.counters["engine_deaths"] == 2 and fleet.counters["nodes_lost"] == 1
    assert [s.deaths for s in fleet.slots] == [1, 1, 0] and fleet.restarted == [0, 1]
    said = [r.getMessage() for r in caplog.records]
    assert (
        sum(f"died (exit code actor died (ActorDiedError)); its node {GONE} was lost; restarting it" in m for m in said)
        == 2
    ), said


def test_a_replacement_that_fails_before_it_serves_is_placed_again_not_reported_dead(fleet, caplog):
    slot = fleet.slots[2]
    slot.state, slot.restarts = "restarting", 1
    with caplog.at_level(logging.WARNING, logger="slime.fleet"):
        fleet.supervisor.on_death(slot, "restart failed: RuntimeError: boom")
    assert fleet.counters["engine_deaths"] == 0 and slot.deaths == 0 and fleet.restarted == [2]
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "engine 2: its replacement failed before it served (restart failed: RuntimeError: boom); placing it again"
    ], said


def test_an_actor_killed_on_a_live_node_is_not_a_node_loss(ray_cluster):
    import threading

    ray = ray_cluster
    from slime.fleet.lost_nodes import actor_death_cause, node_lost

    actor = ray.remote(Placeholder).options(num_cpus=0).remote()
    assert ray.get(actor.ping.remote())
    assert actor_death_cause(actor) is None  # alive
    ray.kill(actor)
    here = ray.get_runtime_context().get_node_id()
    assert node_lost(here, actor, threading.Event(), timeout=120) is False
    assert actor_death_cause(actor) == "RAY_KILL"
