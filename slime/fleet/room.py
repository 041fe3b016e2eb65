"""A replacement's place on the cluster, and engines waiting for a node with room.

A replacement is created on its dead engine's placement-group bundle. After a node loss Ray re-places
that bundle on a surviving node with room; where no node has room within `_PLACEMENT_WAIT_S`, the engine
is `unplaced` with a warning and the pool shrinks, while it waits for Ray to place it: a node with room
that joins later (a node coming back) takes it, and the pool grows back."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any, Callable

import ray

from slime.fleet.engine_slot import EngineSlot, serving
from slime.fleet.lost_nodes import LostNodes

logger = logging.getLogger(__name__)

# seconds a replacement may wait for a place on the cluster (its bundle re-placed after a node loss)
_PLACEMENT_WAIT_S = 120.0


class NoRoomError(RuntimeError):
    """A replacement engine found no place on the cluster (its node is gone and no other has room)."""


def place(slot: EngineSlot, actor: Any, lost_nodes: LostNodes) -> None:
    """Wait until the replacement has a node (`lost_nodes` notes a move). No place within
    `_PLACEMENT_WAIT_S`: `NoRoomError` (the caller then waits on for a node with room, `RoomWait`)."""
    try:
        node = ray.get(actor.node_id.remote(), timeout=_PLACEMENT_WAIT_S)
    except ray.exceptions.GetTimeoutError:
        raise NoRoomError(
            f"no room for a replacement on the surviving nodes within {_PLACEMENT_WAIT_S:.0f}s "
            f"(its node {slot.node_id} is gone; cluster resources: {ray.cluster_resources()}); "
            "the pool shrinks until a node with room joins"
        ) from None
    lost_nodes.placed(slot, node)


class RoomWait:
    """Engines no node has room for. Each waits in a thread of its own, on Ray's placement (an event);
    once placed, `resume(slot, actor)` starts it like any replacement; a placement that fails is its
    death (`died(slot, why)`). `counters`, `stopping` and `lost_nodes` are the fleet's."""

    def __init__(
        self,
        counters: Counter,
        stopping: threading.Event,
        lost_nodes: LostNodes,
        resume: Callable[[EngineSlot, Any], None],
        died: Callable[[EngineSlot, str], None],
    ):
        self.counters, self.stopping, self.lost_nodes = counters, stopping, lost_nodes
        self.resume, self.died = resume, died

    def unplaced(self, slot: EngineSlot, why: str, slots: list[EngineSlot]) -> None:
        """No node has room for this engine now: the pool goes on without it, and it waits (on Ray's
        placement, an event) for a node with room to join."""
        slot.state, slot.last_exit = "unplaced", why
        self.counters["engines_unplaced"] += 1
        logger.warning("engine %d: %s; %d of %d engines serve", slot.rank, why, serving(slots), len(slots))
        threading.Thread(
            target=self._await_room, args=(slot, slot.actor), name=f"engine-room-{slot.rank}", daemon=True
        ).start()

    def _await_room(self, slot: EngineSlot, actor: Any) -> None:
        """Block until Ray places the waiting engine (a node with room joined), then start it. Its actor
        is killed at stop, which ends the wait."""
        try:
            node = ray.get(actor.node_id.remote())
        except Exception:  # noqa: BLE001 - stopped (its actor killed), or its new node died at once
            if not self.stopping.is_set() and slot.actor is actor:
                self.died(slot, "its placement failed")
            return
        if self.stopping.is_set() or slot.actor is not actor:
            return
        self.lost_nodes.placed(slot, node)
        logger.warning("engine %d found room on node %s (a node joined): starting it", slot.rank, node)
        self.resume(slot, actor)
