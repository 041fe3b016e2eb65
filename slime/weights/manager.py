"""The manager's side of weight sync, with slime's names, as functions over the manager's `Fleet`.

A trainer asks the `RolloutManager` for the engines it must update (`get_updatable_engines_and_lock`),
holds the returned lock while it pushes (so two pushers, e.g. a trainer and a recovery, never
interleave buckets), and uses `onload_weights` / `onload_kv` / `offload` around its training step in
colocated mode (slime's order: offload after generate; onload weights, push, onload KV before the
next rollout). `check_weights(action)` asks every engine's weight checker (`compare` against the
trainer's checksums says whether the engines serve exactly the trainer's weights).

Memory tags are SGLang's (`weights`, `kv_cache`, `cuda_graph`): the embedded engine frees and reloads
its model for `weights` and has nothing to do for the others.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray

GPU_MEMORY_TYPE_WEIGHTS = "weights"
GPU_MEMORY_TYPE_KV_CACHE = "kv_cache"
GPU_MEMORY_TYPE_CUDA_GRAPH = "cuda_graph"


class EngineLock:
    """slime's `Lock` actor (`acquire()` -> bool, `release()`), without polling: `acquire` waits for the
    lock (up to `timeout` seconds; slime's callers loop on a False answer) instead of failing at once.
    An async actor, so a waiting `acquire` never blocks the `release` that frees it."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    async def acquire(self, timeout: float | None = 600.0) -> bool:
        try:
            await asyncio.wait_for(self._lock.acquire(), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            return False
        return True

    async def release(self) -> None:
        if not self._lock.locked():
            raise RuntimeError("EngineLock.release: the lock is not held")
        self._lock.release()

    async def locked(self) -> bool:
        return self._lock.locked()


def make_engine_lock() -> Any:
    """A new `EngineLock` actor (no CPU reserved: it only hands out the lock), on the caller's node (the
    manager's, a cluster's head): left to Ray it may land on a worker node, and die with it mid-push."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(EngineLock).options(num_cpus=0, max_concurrency=64, scheduling_strategy=here).remote()


def updatable_engines(fleet: Any) -> list[Any]:
    """Node-0 actors of the engines that serve now and of restarted ones awaiting the current weights
    (kept out of the router until this push reaches them; an engine still being restarted gets the
    weights when `recover_updatable_engines` has brought it back)."""
    return fleet.updatable_engines if fleet is not None else []


def get_updatable_engines_and_lock(fleet: Any, lock: Any, num_new_engines: int = 0) -> tuple:
    """slime's tuple: `(engines, lock, num_new_engines, engine_gpu_counts, engine_gpu_offsets,
    engine_parallel_configs)`. On CPU an engine holds no GPU: counts 0, offsets 0, tp 1."""
    engines = updatable_engines(fleet)
    engine = fleet.config.engine if fleet is not None else None
    gpus = (
        int(engine.rollout_num_gpus_per_engine or 1) if engine is not None and engine.rollout_backend == "sglang" else 0
    )
    counts = [gpus] * len(engines)
    offsets = [i * gpus for i in range(len(engines))]
    configs = [{"tp_size": max(1, gpus), "dp_size": 1, "pp_size": 1, "ep_size": 1} for _ in engines]
    return engines, lock, num_new_engines, counts, offsets, configs


def _each(fleet: Any, method: str, *args: Any) -> list[Any]:
    return fleet.each(method, *args) if fleet is not None else []


def offload(fleet: Any) -> list[Any]:
    """Release every engine's memory (weights and KV cache) while the trainer uses the machine."""
    return _each(fleet, "release_memory_occupation", None)


def onload_weights(fleet: Any) -> list[Any]:
    """Bring the weights back (the push that follows overwrites them with the trainer's)."""
    return _each(fleet, "resume_memory_occupation", [GPU_MEMORY_TYPE_WEIGHTS])


def onload_kv(fleet: Any) -> list[Any]:
    """Bring the KV cache (and CUDA graphs) back, after the push: the engines can serve again."""
    return _each(fleet, "resume_memory_occupation", [GPU_MEMORY_TYPE_KV_CACHE, GPU_MEMORY_TYPE_CUDA_GRAPH])


def check_weights(fleet: Any, action: str, checksums: dict[str, str] | None = None) -> list[dict]:
    """Every serving engine's answer to `check_weights(action)` (`snapshot`, `compare`, `checksum`,
    `reset_tensors`); `compare` with `checksums` ({name: sha256}) checks against the trainer's weights.
    An engine awaiting weights is not asked: it serves nothing yet (e.g. it replaced one that died
    during the push just checked), and it is checked once the next push has admitted it."""
    if fleet is None:
        return []
    return ray.get([s.actor.check_weights.remote(action, checksums) for s in fleet.slots if s.state == "healthy"])
