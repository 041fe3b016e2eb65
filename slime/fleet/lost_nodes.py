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
                lost = self.nodes[node_id] = {"node_id": node_id, "lost_at": time.time(), "engines": [],
                                              "router_moved_to": None}
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
            return [{**lost, "engines": list(lost["engines"]),
                     "moved_to": {r: slots[r].node_id if slots[r].moved_from == lost["node_id"] else None
                                  for r in lost["engines"]}}
                    for lost in self.nodes.values()]


def node_alive(node_id: str) -> bool:
    """Whether Ray's control store still counts `node_id` among the live nodes."""
    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())
