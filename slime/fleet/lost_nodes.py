"""`LostNodes`: what node losses did to the fleet, for its status and counters.

A lost Ray node (its raylet gone: preemption, a kernel panic, a drained host) takes its engines
with it; each is reported and replaced like any dead engine. Ray moves the placement-group bundles
of a dead node to surviving nodes with room (all of a node's bundles at once: Ray re-places the lost
bundles of a group together), so the replacement lands there (slime.fleet.room: where none has room).
`Fleet.info()` lists the lost nodes, the engines they took and where each went, and where the router
went (`lost_nodes`; per engine `node_id` and `moved_from`; `NODE_COUNTERS`)."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

import ray

from slime.fleet.engine_slot import EngineSlot

logger = logging.getLogger(__name__)

# what node losses did, counted over the run: nodes gone, engines placed on another node, engines left
# waiting for a node with room, router moves
NODE_COUNTERS = ("nodes_lost", "engines_moved", "engines_unplaced", "router_moves")


class LostNodes:
    """Each lost node once (node id -> the engines it took, where the router went), counted in the
    fleet's `counters`; `lock` is the fleet's."""

    def __init__(self, counters: Counter, lock: threading.RLock):
        self.counters, self.lock = counters, lock
        self.nodes: dict[str, dict[str, Any]] = {}

    def note(self, node_id: str, slot: EngineSlot | None = None, router_to: str | None = None) -> None:
        """Record (once per node) that `node_id` is gone and took this engine (or the router, now on `router_to`)."""
        with self.lock:
            lost = self.nodes.get(node_id)
            if lost is None:
                lost = self.nodes[node_id] = {
                    "node_id": node_id,
                    "lost_at": time.time(),
                    "engines": [],
                    "router_moved_to": None,
                }
                self.counters["nodes_lost"] += 1
                logger.warning("Ray node %s is gone (its raylet died or was drained)", node_id)
            if slot is not None and slot.rank not in lost["engines"]:
                lost["engines"].append(slot.rank)
            if router_to is not None:
                lost["router_moved_to"] = router_to

    def note_if_gone(self, node_id: str | None, slot: EngineSlot | None = None, router_to: str | None = None) -> None:
        """`note`, when Ray no longer counts `node_id` alive (a death or a move may have other causes)."""
        if node_id is not None and not node_alive(node_id):
            self.note(node_id, slot, router_to)

    def placed(self, slot: EngineSlot, node: str) -> None:
        """The engine's replacement runs on `node`; if it is another one, the old node is gone (a bundle
        only moves when its node dies)."""
        old = slot.node_id
        if old is not None and node != old:
            self.note(old, slot)
            slot.moved_from = old
            self.counters["engines_moved"] += 1
            logger.warning("engine %d moved from lost node %s to node %s", slot.rank, old, node)
        slot.node_id = node

    def status(self, slots: list[EngineSlot]) -> list[dict[str, Any]]:
        """Each lost node, the engines it took and where each of them serves now (None: not yet, or failed)."""
        with self.lock:
            return [
                {
                    **lost,
                    "engines": list(lost["engines"]),
                    "moved_to": {
                        r: slots[r].node_id if slots[r].moved_from == lost["node_id"] else None for r in lost["engines"]
                    },
                }
                for lost in self.nodes.values()
            ]


# seconds Ray may take to decide on a node after one of its actors was seen dying: its health checks
# (defaults: 3 s period x 5 failures, 10 s timeout each) mark a raylet that died dead within ~30 s
NODE_DECISION_S = 60.0


def node_lost(
    node_id: str | None, actor: Any, stopping: threading.Event, timeout: float = NODE_DECISION_S
) -> bool | None:
    """Whether the death of `actor` (an engine actor on `node_id`) is the loss of its node, asked of Ray
    until it decides: True once Ray marks the node dead (or the actor dead for its node's death); False
    once Ray marks the actor dead for another cause (its node's raylet reported it: the node lives); None
    when Ray has not decided within `timeout` seconds. The owner of an actor sees it die 1-3 s before Ray
    marks its node dead: a replacement created on its bundle in between lands on the dead node."""
    if node_id is None:
        return None
    deadline, pause = time.monotonic() + timeout, 0.05
    while not stopping.is_set():
        if not node_alive(node_id):
            return True
        cause = actor_death_cause(actor)
        if cause is not None:
            return cause == "NODE_DIED"
        if time.monotonic() > deadline:
            return None
        stopping.wait(pause)  # Ray has no event for this: asked again, less often, until it decides
        pause = min(2 * pause, 1.0)
    return None


def actor_death_cause(actor: Any) -> str | None:
    """Ray's reason for the actor's death (WORKER_DIED, NODE_DIED, RAY_KILL, ...; "UNSPECIFIED" when it
    gives none), or None while Ray's control store still counts it alive."""
    try:
        info = ray._private.state.actors(actor._actor_id.hex())  # noqa: SLF001 - the GCS's own record, no dashboard needed
    except Exception:  # noqa: BLE001 - an actor Ray no longer knows: nothing to decide by
        return None
    if not info or info.get("State") != "DEAD":
        return None
    cause = info.get("DeathCause")
    try:
        if cause.HasField("actor_died_error_context"):
            ctx = cause.actor_died_error_context
            return ctx.DESCRIPTOR.fields_by_name["reason"].enum_type.values_by_number[ctx.reason].name
    except Exception:  # noqa: BLE001 - another shape of the record: dead, for no known reason
        pass
    return "UNSPECIFIED"


def node_alive(node_id: str) -> bool:
    """Whether Ray's control store still counts `node_id` among the live nodes."""
    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())
