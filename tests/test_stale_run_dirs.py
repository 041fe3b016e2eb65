"""Temp directories of runs that died without their orderly stop (SIGKILL) are removed by the next
run: `/tmp/slime-ray-<pid>` and `/tmp/slime-fork-<pid>-*` of processes that no longer exist."""

from __future__ import annotations

import os
import subprocess
import sys

from slime.ray.stale_dirs import remove_stale_run_dirs


def a_dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_dirs_of_gone_runs_are_removed_and_live_ones_kept(tmp_path):
    dead, alive = a_dead_pid(), os.getppid()
    stale = [tmp_path / f"slime-ray-{dead}", tmp_path / f"slime-fork-{dead}-k2j4"]
    kept = [
        tmp_path / f"slime-ray-{alive}",
        tmp_path / f"slime-fork-{alive}-x1",
        tmp_path / f"slime-ray-{os.getpid()}",
        tmp_path / "slime-fork-abc",
        tmp_path / "other-dir",
    ]
    for d in stale + kept:
        d.mkdir()
        (d / "sock").write_text("")
    (tmp_path / f"slime-ray-{dead}-file").write_text("")  # not a run dir's name
    assert sorted(remove_stale_run_dirs(tmp_path)) == sorted(stale)
    assert all(not d.exists() for d in stale) and all(d.is_dir() for d in kept)
