"""Test helpers that read a running `RolloutManager`'s engine table (`status()["engines"]`)."""

from __future__ import annotations

import contextlib
import shutil
import time
from typing import Any, Iterator


def engine_status(manager: Any, rank: int) -> dict:
    """Engine `rank`'s row of the manager's `status()`."""
    import ray

    return ray.get(manager.status.remote())["engines"][rank]


def wait_engine_state(manager: Any, rank: int, states: tuple[str, ...], timeout: float = 240.0) -> dict:
    """Engine `rank`'s row once its state is one of `states` (the fleet exposes no event to wait on)."""
    deadline = time.monotonic() + timeout
    while (row := engine_status(manager, rank))["state"] not in states:
        assert time.monotonic() < deadline, f"engine {rank} never reached {states}: {row}"
        time.sleep(0.1)
    return row


@contextlib.contextmanager
def manager_and_trainer(args: Any, fork_server: str | None = None, *, warm: bool = False) -> Iterator[tuple[Any, Any]]:
    """slime-train's own pieces for a test: the manager actor (with the fault hooks) and a started trainer group (dp 1),
    both stopped at the end whatever happened. Engines (and their replacements) fork warm from
    `fork_server` (a running engine fork server's socket), or, with `warm`, from one started here
    as `slime-train` starts it on its own Ray (slime.engine.warm_start); else they start cold."""
    import ray

    from slime.ray.flags import SessionConfig
    from slime.ray.session import start_engine_fork_server, start_manager, stop_manager
    from slime.testing.fault_manager import FaultInjectingManager
    from slime.train.actor_group import TrainGroup
    from slime.train.flags import WorkerConfig

    manager = group = server = None
    try:
        server = start_engine_fork_server(SessionConfig.from_args(args)) if warm and fork_server is None else None
        manager, _ = start_manager(
            args, FaultInjectingManager, fork_server=server.socket_path if server is not None else fork_server
        )
        group = TrainGroup(WorkerConfig.from_args(args), args)
        group.start()
        ray.get(manager.set_train_parallel_config.remote({"dp_size": 1}))
        yield manager, group
    finally:
        if group is not None:
            group.shutdown()
        stop_manager(manager)
        if server is not None:
            server.stop(timeout=5)
            shutil.rmtree(server.where, ignore_errors=True)


def batch_weight_versions(boxes: list) -> set[str]:
    """Every weight version a rollout's batches (one Box per rank) were sampled with."""
    import ray

    return {v for box in boxes for vs in ray.get(box.inner)["weight_versions"] for v in vs}
