"""Placement groups for the engines: GPU bundles for SGLang, fractional CPU bundles for the
embedded engine, reserved up front so a rollout never starts half-placed."""

from __future__ import annotations

from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


class PlacementError(RuntimeError):
    pass


def engine_bundles(args: Any) -> list[dict[str, float]]:
    if args.rollout_backend == "sglang":
        return [{"GPU": 1, "CPU": 1} for _ in range(args.rollout_num_gpus)]
    return [{"CPU": float(args.rollout_num_cpus_per_engine)} for _ in range(args.rollout_num_engines)]


def create_engine_placement_group(args: Any, timeout: float = 120.0):
    bundles = engine_bundles(args)
    pg = placement_group(bundles, strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=timeout)
    if not ready:
        remove_placement_group(pg)
        raise PlacementError(f"could not reserve {len(bundles)} bundle(s) {bundles[0]} within {timeout:.0f}s; "
                             f"cluster resources: {ray.cluster_resources()} "
                             f"(check --rollout-num-engines / --rollout-num-gpus / --rollout-num-cpus-per-engine)")
    return pg


def bundle_strategy(pg, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index,
                                            placement_group_capture_child_tasks=True)
