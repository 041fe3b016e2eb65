"""Lost Ray nodes in words and numbers, for the per-rollout line and the dashboard.

An entry is the fleet's record of one lost node (`Fleet.lost_node_status()`): `node_id`, `lost_at`,
`engines` (ranks it took), `moved_to` ({rank: node id now serving it, or None while it waits for a
place}) and `router_moved_to` (the node the router went to, or None when it was not there).
"""

from __future__ import annotations

from typing import Any

SHORT_ID = 8  # hex characters of a node id shown in lines (Ray's own logs show as many)


def short(node_id: str | None) -> str:
    return "?" if node_id is None else node_id[:SHORT_ID]


def describe_lost_node(entry: dict[str, Any]) -> str:
    """`node 1a2b3c4d: engine 0 -> node 5e6f7a8b, engine 1 -> waiting for room; router -> node 9c0d1e2f`."""
    moved = entry.get("moved_to") or {}
    parts = [
        f"engine {rank} -> " + (f"node {short(moved.get(rank))}" if moved.get(rank) else "waiting for room")
        for rank in sorted(entry.get("engines") or [])
    ]
    text = f"node {short(entry['node_id'])}: " + (", ".join(parts) if parts else "no engine")
    if entry.get("router_moved_to"):
        text += f"; router -> node {short(entry['router_moved_to'])}"
    return text


def node_loss_metrics(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """`fleet/*` for a dashboard: counts, and the losses in words (`fleet/lost_nodes`)."""
    moved = [node for e in entries for node in (e.get("moved_to") or {}).values()]
    return {
        "fleet/nodes_lost": len(entries),
        "fleet/engines_moved": sum(node is not None for node in moved),
        "fleet/engines_waiting_for_room": sum(node is None for node in moved),
        "fleet/router_moves": sum(bool(e.get("router_moved_to")) for e in entries),
        "fleet/lost_nodes": "; ".join(describe_lost_node(e) for e in entries),
    }
