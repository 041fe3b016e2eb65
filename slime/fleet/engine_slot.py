"""`EngineSlot`: one engine of the pool, and the states its life goes through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ENGINE_STATES = ("starting", "healthy", "dead", "restarting", "awaiting_weights", "unplaced", "failed", "stopped")
UPDATABLE_STATES = ("healthy", "awaiting_weights")  # engines a weight push (or another control call) must reach


@dataclass
class EngineSlot:
    """One engine of the pool: its actors (one per node), where it serves, and its life so far."""

    rank: int
    actors: list[Any]
    bundles: list[int]
    url: str | None = None
    state: str = "starting"
    restarts: int = 0
    deaths: int = 0
    last_exit: Any = None
    node_id: str | None = None  # the Ray node serving it (node 0's, for a multi-node engine)
    moved_from: str | None = None  # the lost node it was last moved away from
    node_lost: bool = False  # taken out of service because its node was found lost; its watcher reports it

    @property
    def actor(self) -> Any:
        return self.actors[0]  # node 0 takes the requests

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "url": self.url,
            "state": self.state,
            "restarts": self.restarts,
            "deaths": self.deaths,
            "last_exit": self.last_exit,
            "node_id": self.node_id,
            "moved_from": self.moved_from,
        }


def serving(slots: list[EngineSlot]) -> int:
    """How many engines take requests."""
    return sum(s.state == "healthy" for s in slots)
