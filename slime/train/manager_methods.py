"""The `RolloutManager` methods a trainer calls beyond the rollout API, as delegations to
`slime.ray.weight_sync` and the manager's parts.

These are meant to be methods of `RolloutManager` itself (see the report of issue 13); until they
are, `manager_class()` returns a subclass that adds the missing ones, so `slime-train` runs either
way. Once `RolloutManager` has them all, `manager_class()` returns it unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slime.ray import weight_sync


class TrainerManagerMethods:
    """Mixed into RolloutManager (uses its `fleet`, `controller`, `wandb_run`, `args`)."""

    _engine_lock: Any = None

    def get_updatable_engines_and_lock(self) -> tuple:
        if self._engine_lock is None:
            self._engine_lock = weight_sync.make_engine_lock()
        return weight_sync.get_updatable_engines_and_lock(self.fleet, self._engine_lock)

    def onload_weights(self) -> list[Any]:
        return weight_sync.onload_weights(self.fleet)

    def onload_kv(self) -> list[Any]:
        return weight_sync.onload_kv(self.fleet)

    def check_weights(self, action: str, checksums: dict[str, str] | None = None) -> list[dict]:
        return weight_sync.check_weights(self.fleet, action, checksums)

    def wandb_run_id(self) -> str | None:
        return self.wandb_run.id if self.wandb_run is not None else None

    def metrics_dir(self) -> str | None:
        from slime.observability.metrics_log import metrics_dir

        d = metrics_dir(self.args, self.wandb_run)
        return str(d) if d is not None else None

    def load(self, rollout_id: int | None = None) -> int | None:
        """Restore the data source from `--load`: the state saved at `rollout_id` (a trainer resuming
        from its checkpoint of that rollout), else the newest; returns that rollout id."""
        source = self.controller.data_source if self.controller else None
        if source is None or not self.args.load:
            return None
        if rollout_id is None:
            return source.load(self.args.load)
        path = Path(self.args.load) / f"rollout_state_{rollout_id}.json"
        if not path.is_file():
            raise FileNotFoundError(f"--load {self.args.load}: no data source state for rollout {rollout_id} ({path})")
        source.load_state_dict(json.loads(path.read_text()))
        return rollout_id


_NEEDED = ("get_updatable_engines_and_lock", "onload_weights", "onload_kv", "check_weights", "wandb_run_id",
           "metrics_dir")


def manager_class() -> type:
    from slime.ray.rollout_manager import RolloutManager

    if all(hasattr(RolloutManager, name) for name in _NEEDED):
        return RolloutManager
    return type("RolloutManager", (TrainerManagerMethods, RolloutManager), {})
