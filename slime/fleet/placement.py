"""Placement groups for the engines and the trainer: GPU bundles for SGLang, fractional CPU bundles
for the embedded engine and the trainer's workers, reserved up front so a run never starts half-placed.

A reservation the cluster can never grant fails at once with the arithmetic (what is asked, what
this run's other groups already hold, what the cluster has in total), instead of after the wait:
Ray would keep the group pending forever, and the cluster's totals are known from the start."""

from __future__ import annotations

import uuid
from typing import Any

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

PLACEMENT_TIMEOUT_S = 120.0  # a grantable reservation may wait for resources another job frees
ENGINE_FLAGS = "--rollout-num-engines / --rollout-num-gpus / --rollout-num-cpus-per-engine"
_LIVE_STATES = ("PENDING", "CREATED", "RESCHEDULING")
NAME_SEP = "#"  # a group's Ray name is "<label>#<unique>": names are unique per namespace, labels are not


class PlacementError(RuntimeError):
    pass


def engine_bundles(config: Any) -> list[dict[str, float]]:
    """The engines' bundles (`config`: the fleet's `slime.fleet.flags.FleetConfig`)."""
    if config.engine.rollout_backend == "sglang":
        return [{"GPU": 1, "CPU": 1} for _ in range(config.rollout_num_gpus)]
    return [{"CPU": float(config.rollout_num_cpus_per_engine)} for _ in range(config.rollout_num_engines)]


def _num(x: float) -> str:
    return f"{x:g}"


def _held_by_this_job(resources: set[str]) -> list[tuple[str, dict[str, float]]]:
    """(name, resources) of every live placement group this job created (they stay for the run)."""
    job = ray.get_runtime_context().get_job_id()
    held = []
    for pg_id, entry in placement_group_table().items():
        if not pg_id.endswith(job) or entry.get("state") not in _LIVE_STATES:
            continue
        sums = {r: sum(float(b.get(r, 0)) for b in entry.get("bundles", {}).values()) for r in resources}
        if any(sums.values()):
            held.append(((entry.get("name") or pg_id).split(NAME_SEP)[0], sums))
    return held


def check_fits(bundles: list[dict[str, float]], what: str, flags: str) -> None:
    """Raise PlacementError when `bundles` can never be reserved: a bundle larger than every node, or
    all of them plus what this run's other placement groups hold beyond the cluster's totals."""
    resources = {r for b in bundles for r in b}
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    for r in sorted(resources):
        largest = max(float(b.get(r, 0)) for b in bundles)
        biggest_node = max((float(n.get(r, 0)) for n in nodes), default=0.0)
        if largest > biggest_node:
            raise PlacementError(
                f"cannot place {what}: a bundle needs {_num(largest)} {r}, the largest node has "
                f"{_num(biggest_node)} {r} (check {flags})"
            )
    total = ray.cluster_resources()
    held = _held_by_this_job(resources)
    for r in sorted(resources):
        need = sum(float(b.get(r, 0)) for b in bundles)
        others = [(name, sums[r]) for name, sums in held if sums[r]]
        have = float(total.get(r, 0))
        if need + sum(x for _, x in others) > have + 1e-9:
            sizes = sorted({_num(float(b.get(r, 0))) for b in bundles})
            asked = f"{len(bundles)} bundle(s) of {' / '.join(sizes)} {r} = {_num(need)} {r}"
            if others:
                asked += "".join(f" + {_num(x)} {r} held by {name}" for name, x in others)
                asked += f" = {_num(need + sum(x for _, x in others))} {r}"
            raise PlacementError(
                f"cannot place {what}: {asked}, but the cluster has {_num(have)} {r} in total (check {flags})"
            )


def reserve(bundles: list[dict[str, float]], *, name: str, what: str, flags: str, timeout: float = PLACEMENT_TIMEOUT_S):
    """A ready placement group (PACK) of `bundles` labelled `name`; PlacementError at once when it can
    never fit (`check_fits`), or when it is not granted within `timeout` (resources in use elsewhere).
    Two managers in one cluster (or a group a crashed run left behind) each get their own Ray name."""
    check_fits(bundles, what, flags)
    pg = placement_group(bundles, strategy="PACK", name=f"{name}{NAME_SEP}{uuid.uuid4().hex[:12]}")
    ready, _ = ray.wait([pg.ready()], timeout=timeout)
    if not ready:
        remove_placement_group(pg)
        raise PlacementError(
            f"could not reserve {what}: {len(bundles)} bundle(s) {bundles[0]} within {timeout:.0f}s; "
            f"available now: {ray.available_resources()} (check {flags})"
        )
    return pg


def create_engine_placement_group(config: Any, timeout: float = PLACEMENT_TIMEOUT_S):
    return reserve(
        engine_bundles(config), name="slime-engines", what="the engines", flags=ENGINE_FLAGS, timeout=timeout
    )


def bundle_strategy(pg, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=index, placement_group_capture_child_tasks=True
    )
