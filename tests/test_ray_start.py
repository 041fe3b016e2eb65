"""The session's Ray start is tried again when Ray's raylet misses its 30 s registration under load
(slime/testing/ray_start.py), and only then: a start that failed otherwise is reported at once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slime.testing.ray_start import init_with_retries


def test_a_raylet_startup_timeout_is_retried_after_its_processes_are_killed(tmp_path):
    marker = tmp_path / "ray-tmp"
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(marker)])
    calls = []

    def init():
        calls.append(leftover.poll() is None)  # still running?
        if len(calls) == 1:
            raise Exception("The current node timed out during startup. This could happen because ...")
        return "started"

    try:
        assert init_with_retries(init, marker) == "started"
        assert calls == [True, False]  # the failed start's process (it names the temp dir) was killed first
    finally:
        if leftover.poll() is None:
            leftover.kill()
        leftover.wait()


def test_other_errors_and_the_last_timeout_are_raised():
    def refused():
        raise ValueError("num_cpus must be >= 0")

    with pytest.raises(ValueError, match="num_cpus"):
        init_with_retries(refused, "/nonexistent-marker")
    calls = []

    def always_late():
        calls.append(1)
        raise Exception("The current node timed out during startup.")

    with pytest.raises(Exception, match="timed out during startup"):
        init_with_retries(always_late, "/nonexistent-marker", attempts=2)
    assert len(calls) == 2
