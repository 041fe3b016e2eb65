"""Test helpers that read a running `RolloutManager`'s engine table (`status()["engines"]`)."""

from __future__ import annotations

import time
from typing import Any


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
