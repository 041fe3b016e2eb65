"""What the fleet went through during one rollout, for slime-train's per-rollout line and record: the
fields slime-rollout's line shows (engine deaths and restarts, the nodes lost and where their engines and
the router went), plus the node counters. The manager already logs them per rollout (`perf/*`, `fleet/*`);
the trainer reads them from the manager's summary of that rollout."""

from __future__ import annotations

from typing import Any

# per-rollout counters of the manager's summary (slime.rollout.controller.rollout_summary)
FLEET_FIELDS = ("engine_deaths", "engine_restarts", "nodes_lost", "engines_moved", "engines_unplaced", "router_moves")


def fleet_events(summary: dict[str, Any] | None, rollout_id: int) -> dict[str, Any]:
    """The counters and `lost_nodes` (one description per node) of the manager's `last_summary`, if it is
    the summary of `rollout_id`; {} otherwise (no summary, or another rollout's)."""
    if not summary or summary.get("rollout_id") != rollout_id:
        return {}
    return {**{k: int(summary.get(k) or 0) for k in FLEET_FIELDS}, "lost_nodes": list(summary.get("lost_nodes") or [])}


def describe_fleet_events(events: dict[str, Any]) -> str:
    """` engine_deaths=1 engine_restarts=1 nodes_lost=1 (node 1a2b3c4d: engine 1 -> node 5e6f7a8b)`, as
    slime-rollout's line ends; "" when nothing happened."""
    text = "".join(f" {k}={events[k]}" for k in ("engine_deaths", "engine_restarts") if events.get(k))
    lost = events.get("lost_nodes") or []
    return text + (f" nodes_lost={len(lost)} ({'; '.join(lost)})" if lost else "")
