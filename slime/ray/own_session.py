"""`ray_processes_in_own_sessions`: the processes of a Ray we start (GCS, raylet, agents; the raylet's
workers follow it) lead sessions of their own, as every other child of a command does
(`slime.utils.child_process`).

Why: systemd, Slurm and `kill -TERM -PGID` signal the command's whole process group. Ray's processes
were in it: the GCS and raylet died of that SIGTERM at once, and the command's orderly stop, which
goes through them, waited 60 s before Ray's "Failed to connect to GCS within 60 seconds" ended it
(rc 1, no stop line). Out of the group, only the command gets the signal and stops everything in
order (143), as for a SIGTERM to the command alone. Nothing is left behind if the command dies by
SIGKILL: Ray starts them with `PR_SET_PDEATHSIG` (its kernel fate-sharing), and the command is the
subreaper of what remains (`slime.cli.lifeline`). Ray does the same on Windows (a new process group
per process when fate-sharing is available).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator


@contextlib.contextmanager
def ray_processes_in_own_sessions() -> Iterator[None]:
    """Around `ray.init` of a Ray this command starts (Linux, when Ray shares the processes' fate
    with the driver; otherwise the processes stay where Ray puts them)."""
    import ray._private.services as services
    import ray._private.utils as ray_utils

    if not sys.platform.startswith("linux") or not ray_utils.detect_fate_sharing_support():
        yield
        return
    original = services.ConsolePopen

    class OwnSessionPopen(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("start_new_session", True)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnSessionPopen
    try:
        yield
    finally:
        services.ConsolePopen = original
