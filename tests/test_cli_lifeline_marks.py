"""The lifeline finds the processes a command started by the mark in their environment, wherever they moved
(Ray's processes lead sessions of their own and rename themselves with setproctitle)."""

from __future__ import annotations

import os
import subprocess
import sys

from slime.cli.lifeline import MARK, marked_pids


def test_marked_processes_are_found_in_their_own_sessions_and_others_are_not():
    env = {**os.environ, MARK: "424242"}
    marked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, MARK: "4242420"}, start_new_session=True)
    try:
        found = marked_pids(424242)
        assert marked.pid in found and other.pid not in found
    finally:
        for p in (marked, other):
            p.kill()
            p.wait()
