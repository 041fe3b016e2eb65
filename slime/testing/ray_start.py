"""The test session's local Ray, started again when Ray gives up on its own raylet under load.

Why: Ray waits a fixed 30 s for a new node's raylet to register with the GCS (ray/_private/node.py, not
configurable) and then raises "The current node timed out during startup". On this 2-core box at load 25-45
(six sessions' suites) that happened to the session's `ray_cluster` fixture, and every Ray test of the run
errored at set-up. The raylet was slow, not broken: a second start succeeds. The processes of the failed
start are found by the session's own temp dir (on their command lines) and killed first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

STARTUP_TIMEOUT = "timed out during startup"


def init_with_retries(init: Callable[[], Any], temp_dir: Path, attempts: int = 3) -> Any:
    """`init()` (a `ray.init` call using `temp_dir`), tried up to `attempts` times while Ray's error is its
    raylet start-up timeout; any other error is raised at once."""
    for attempt in range(1, attempts + 1):
        try:
            return init()
        except Exception as e:  # Ray raises a bare Exception for it
            if STARTUP_TIMEOUT not in str(e) or attempt == attempts:
                raise
            _kill_processes_naming(temp_dir)


def _kill_processes_naming(marker: Path) -> None:
    import psutil

    from slime.testing.processes import processes_naming

    left = processes_naming(marker)
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=30)
