"""A lost node whose engines find no room on the surviving nodes: each is `failed` with a warning and the
pool shrinks, and the fleet's status names the node and shows its engines went nowhere. (The engines that do
find room are moved: tests/test_multinode.py, on a real multi-raylet cluster.)"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest


class Placeholder:
    """Stands for an engine actor: something alive that can be killed."""

    def ping(self) -> bool:
        return True

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


def test_engines_of_a_lost_node_with_no_room_left_fail_and_the_pool_shrinks(ray_cluster, monkeypatch, caplog):
    ray = ray_cluster
    from slime.fleet import fleet as fleet_module
    from slime.fleet.fleet import EngineSlot, Fleet

    monkeypatch.setattr(fleet_module, "_PLACEMENT_WAIT_S", 1.0)
    fleet = Fleet(SimpleNamespace(engine_max_restarts=3, engine_startup_timeout=30.0))
    old = ray.remote(Placeholder).options(num_cpus=0).remote()
    survivor = ray.remote(Placeholder).options(num_cpus=0).remote()
    assert ray.get(old.ping.remote())
    here = ray.get_runtime_context().get_node_id()
    gone = "f" * 56  # a node id Ray does not know: not alive
    fleet.slots = [EngineSlot(0, [old], [0], state="healthy", node_id=gone),
                   EngineSlot(1, [survivor], [1], url="http://127.0.0.1:9", state="healthy", node_id=here)]
    unplaceable = []

    def new_actor(rank, bundle, *rest):  # its bundle cannot be placed anywhere: no node has this resource
        unplaceable.append(ray.remote(Placeholder).options(num_cpus=0, resources={"lost_node_only": 1}).remote())
        return unplaceable[-1]

    monkeypatch.setattr(fleet, "_new_actor", new_actor)
    with caplog.at_level(logging.WARNING, logger="slime.fleet.fleet"):
        fleet._on_death(fleet.slots[0], "actor died (ActorDiedError)")

    assert [s.state for s in fleet.slots] == ["failed", "healthy"]
    assert fleet.endpoints.engine_urls == ["http://127.0.0.1:9"]  # the pool goes on with the survivor
    assert fleet.counters["engine_failed"] == 1 and fleet.counters["nodes_lost"] == 1
    assert fleet.counters["engine_deaths"] == 1 and fleet.counters["engine_restarts"] == 1
    [lost] = fleet.lost_node_status()
    assert (lost["node_id"], lost["engines"], lost["moved_to"]) == (gone, [0], {0: None})
    assert fleet.info()["lost_nodes"] == [lost]
    assert fleet.engine_status()[0]["node_id"] == gone and fleet.engine_status()[0]["moved_from"] is None
    assert any("no room for a replacement" in r.getMessage() and "the pool shrinks" in r.getMessage()
               for r in caplog.records)
    assert any(f"Ray node {gone} is gone" in r.getMessage() for r in caplog.records)
    [pending] = unplaceable  # the placement that never came is cancelled, not left waiting in Ray
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(pending.ping.remote(), timeout=60)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(old.ping.remote(), timeout=60)
    ray.kill(survivor)
