"""The exit hook of a command (slime.cli.lifeline.reap_descendants): it stops what still runs and
names it, and only collects what already exited (issue 20: a successful slime-train ended with
`stopped 1 leftover process(es) at exit: ... (ray::TrainWorker, zombie)`, a Ray worker that had
exited after its raylet and was re-parented to the command, the subreaper)."""

from __future__ import annotations

import os
import subprocess
import sys


def _run(code: str) -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": root}
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


ORPHANS = r"""
import os, signal, subprocess, sys
from slime.cli import lifeline

assert lifeline.become_subreaper()
gate_r, gate_w = os.pipe()
# an orphan that exits (as a Ray worker after its raylet) and one that keeps running
exiting = subprocess.Popen([sys.executable, "-c", "import os, sys; os.read(int(sys.argv[1]), 1)", str(gate_r)],
                           pass_fds=(gate_r,), start_new_session=True)
running = subprocess.Popen(["sleep", "600"], start_new_session=True)
os.close(gate_r)
os.close(gate_w)  # `exiting` ends now; nobody waits for it but the kernel's zombie
os.waitid(os.P_PID, exiting.pid, os.WEXITED | os.WNOWAIT)  # exited, not collected: a zombie child
left = lifeline.reap_descendants(grace=5)
print(repr(left))
print(os.path.exists(f"/proc/{exiting.pid}"), running.poll() is not None)
"""


def test_exit_hook_names_what_runs_and_only_collects_what_exited():
    out = _run(ORPHANS).splitlines()
    left = eval(out[0])  # noqa: S307 - our own repr of a list of strings
    assert len(left) == 1 and "(sleep 600, sleep, sleeping)" in left[0], left
    assert out[1] == "False True"  # the exited one was collected, the running one stopped
