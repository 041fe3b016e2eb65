"""`remove_stale_run_dirs`: the temp directories of runs that ended without their orderly stop.

A run removes its own `/tmp/slime-ray-<pid>` (Ray's sockets and session logs) and
`/tmp/slime-fork-<pid>-*` (the engine fork server's socket) when it stops; one that was SIGKILLed
cannot. The next run on the machine removes those of processes that no longer exist (owned by this
user; a directory whose pid runs again, reused, is left alone).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

RUN_DIR = re.compile(r"^slime-(?:ray-(?P<ray>\d+)|fork-(?P<fork>\d+)-.+)$")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: running
        return True
    return True


def remove_stale_run_dirs(root: str | Path | None = None) -> list[Path]:
    """Remove (and return) this user's run directories under `root` (the temp dir) whose process is gone."""
    removed = []
    base = Path(root or tempfile.gettempdir())
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    for path in entries:
        m = RUN_DIR.match(path.name)
        if m is None:
            continue
        pid = int(m["ray"] or m["fork"])
        try:
            st = path.lstat()
        except OSError:
            continue
        if st.st_uid != os.getuid() or not path.is_dir() or path.is_symlink() or pid == os.getpid() or _running(pid):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
