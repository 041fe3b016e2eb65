"""`TrainGroup`: the trainer's workers as one Ray actor group (slime's `RayTrainGroup`), one CPU
bundle of a placement group per data-parallel rank.

Start-up is all-or-nothing: if a worker cannot be placed or fails to initialise, every worker
and the placement group are released and the error names the cause. Every wait is bounded.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group

from slime.fleet.placement import bundle_strategy, reserve
from slime.train.flags import WorkerConfig
from slime.train.worker import TrainWorker

logger = logging.getLogger(__name__)

INIT_TIMEOUT_S = 900.0  # model load on a busy 2-core box


class TrainGroup:
    def __init__(self, config: WorkerConfig, plugin_args: Any):
        """`plugin_args`: the namespace each worker gives slime's plugins (`TrainWorker`)."""
        self.config, self.plugin_args = config, plugin_args
        self.num_workers = int(config.train.actor_num_workers)
        if self.num_workers < 1:
            raise ValueError(f"--actor-num-workers must be >= 1, got {self.num_workers}")
        self.pg = None
        self.workers: list[Any] = []
        self.start_rollout_id = 0
        self.loaded_rollout_id: int | None = None

    def start(self) -> dict[str, Any]:
        cpus = float(self.config.train.actor_num_cpus_per_worker)
        try:
            self.pg = reserve(
                [{"CPU": cpus}] * self.num_workers,
                name="slime-trainer",
                what="the trainer",
                flags="--actor-num-workers / --actor-num-cpus-per-worker",
            )
            remote_cls = ray.remote(TrainWorker)
            self.workers = [
                remote_cls.options(num_cpus=cpus, scheduling_strategy=bundle_strategy(self.pg, rank)).remote(
                    self.config, self.plugin_args, self.num_workers, rank
                )
                for rank in range(self.num_workers)
            ]
            addr, port = ray.get(self.workers[0].master_address.remote(), timeout=INIT_TIMEOUT_S)
            infos = ray.get([w.init.remote(addr, port) for w in self.workers], timeout=INIT_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise
        self.start_rollout_id = infos[0]["start_rollout_id"]
        self.loaded_rollout_id = infos[0]["loaded_rollout_id"]
        return infos[0]

    # ---- slime's calls ----
    def async_train(self, rollout_id: int, boxes: list[Any]) -> list[Any]:
        return [w.train.remote(rollout_id, boxes) for w in self.workers]

    def train(self, rollout_id: int, boxes: list[Any]) -> dict[str, Any]:
        """Every rank trains its Box; rank 0's metrics."""
        return ray.get(self.async_train(rollout_id, boxes))[0]

    def update_weights(self, manager: Any, weight_version: str, mode: str) -> dict[str, Any]:
        return ray.get(self.workers[0].update_weights.remote(manager, weight_version, mode))

    def weight_checksums(self) -> dict[str, str]:
        return ray.get(self.workers[0].weight_checksums.remote())

    def save_model(self, rollout_id: int) -> str:
        return ray.get([w.save_model.remote(rollout_id) for w in self.workers])[0]

    def shutdown(self) -> None:
        """Stop every worker and free the placement group; each step runs even if one fails."""
        if self.workers:
            try:
                ray.get([w.shutdown.remote() for w in self.workers], timeout=30)
            except Exception as e:  # noqa: BLE001 - a dead worker is stopped below anyway
                logger.warning("trainer shutdown: %s", e)
            for w in self.workers:
                try:
                    ray.kill(w)
                except Exception:  # noqa: BLE001
                    pass
            self.workers = []
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:  # noqa: BLE001
                pass
            self.pg = None
