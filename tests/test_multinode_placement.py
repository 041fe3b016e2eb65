"""A lost node whose engines find no room on the surviving nodes: each is `unplaced` with a warning and the
pool shrinks, its placement still waiting in Ray (a node with room that joins takes it), and the fleet's status
names the node and shows its engines went nowhere yet. (Engines that find room are moved, and a node joining
later takes the waiting ones: tests/test_multinode.py, on a real multi-raylet cluster.)"""

from __future__ import annotations

import logging

import pytest
from tests.fleet_configs import fleet_config


class Placeholder:
    """Stands for an engine actor: something alive that can be killed."""

    def ping(self) -> bool:
        return True

    def stop(self) -> None:
        pass

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


def test_engines_of_a_lost_node_with_no_room_left_wait_unplaced_and_the_pool_shrinks(ray_cluster, monkeypatch, caplog):
    ray = ray_cluster
    from slime.fleet import room
    from slime.fleet.fleet import EngineSlot, Fleet
    from slime.observability.node_losses import describe_lost_node, node_loss_metrics

    monkeypatch.setattr(room, "_PLACEMENT_WAIT_S", 1.0)
    fleet = Fleet(fleet_config("--engine-startup-timeout", "30"))
    old = ray.remote(Placeholder).options(num_cpus=0).remote()
    survivor = ray.remote(Placeholder).options(num_cpus=0).remote()
    assert ray.get(old.ping.remote())
    here = ray.get_runtime_context().get_node_id()
    gone = "f" * 56  # a node id Ray does not know: not alive
    fleet.slots = [
        EngineSlot(0, [old], [0], state="healthy", node_id=gone),
        EngineSlot(1, [survivor], [1], url="http://127.0.0.1:9", state="healthy", node_id=here),
    ]
    unplaceable = []

    def new_actor(rank, bundle, *rest):  # its bundle cannot be placed anywhere: no node has this resource
        unplaceable.append(ray.remote(Placeholder).options(num_cpus=0, resources={"lost_node_only": 1}).remote())
        return unplaceable[-1]

    monkeypatch.setattr(fleet, "new_actor", new_actor)
    with caplog.at_level(logging.WARNING, logger="slime.fleet"):
        fleet.supervisor.on_death(fleet.slots[0], "actor died (ActorDiedError)")

    assert [s.state for s in fleet.slots] == ["unplaced", "healthy"]
    assert fleet.endpoints.engine_urls == ["http://127.0.0.1:9"]  # the pool goes on with the survivor
    assert fleet.counters["engines_unplaced"] == 1 and fleet.counters["nodes_lost"] == 1
    assert fleet.counters["engine_failed"] == 0 and fleet.counters["engines_moved"] == 0
    assert fleet.counters["engine_deaths"] == 1 and fleet.counters["engine_restarts"] == 1
    [lost] = fleet.lost_node_status()
    assert (lost["node_id"], lost["engines"], lost["moved_to"], lost["router_moved_to"]) == (gone, [0], {0: None}, None)
    # in words and numbers, as the rollout's line and the dashboard show it
    assert describe_lost_node(lost) == "node ffffffff: engine 0 -> waiting for room"
    assert node_loss_metrics([lost]) == {
        "fleet/nodes_lost": 1,
        "fleet/engines_moved": 0,
        "fleet/engines_waiting_for_room": 1,
        "fleet/router_moves": 0,
        "fleet/lost_nodes": "node ffffffff: engine 0 -> waiting for room",
    }
    info = fleet.info()
    assert info["lost_nodes"] == [lost]
    assert (info["nodes_lost"], info["engines_moved"], info["engines_unplaced"], info["router_moves"]) == (1, 0, 1, 0)
    assert fleet.engine_status()[0]["node_id"] == gone and fleet.engine_status()[0]["moved_from"] is None
    assert any(
        "no room for a replacement" in r.getMessage()
        and "the pool shrinks until a node with room joins" in r.getMessage()
        and "1 of 2 engines serve" in r.getMessage()
        for r in caplog.records
    )
    assert any(f"Ray node {gone} is gone" in r.getMessage() for r in caplog.records)
    [pending] = unplaceable  # still waiting in Ray for a node with room, as the engine's own actor
    assert fleet.slots[0].actor is pending
    ready, _ = ray.wait([pending.ping.remote()], timeout=0.5)
    assert ready == []
    for what, step in fleet.stop_steps():  # stopping kills the waiting actor, which ends the wait for room
        if what != "placement group":
            step()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(pending.ping.remote(), timeout=60)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(old.ping.remote(), timeout=60)
    assert [s.state for s in fleet.slots] == ["stopped", "stopped"]


def test_a_router_resource_no_node_offers_is_refused_naming_the_flag(ray_cluster):
    from slime.fleet.placement import PlacementError
    from slime.fleet.router_host import RelocatingRouter

    here = ray_cluster.get_runtime_context().get_node_id()
    router = RelocatingRouter("no_node_has_this", here, {}, on_move=lambda *a: None)
    with pytest.raises(PlacementError, match=r"--router-resource no_node_has_this: no live node of the cluster offers"):
        router.start()
    assert router.url is None and router.workers == []
