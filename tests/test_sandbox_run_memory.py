"""A run's memory limit is lowered once the previous run's pages are released, or the run is refused.

`RunMemory` on plain files standing in for the slot's cgroup files (they read back what was written,
as the kernel's do when a write holds): the usage file says how much the previous runs still hold.
The kernel uncharges a dropped tmpfs a little after its namespace goes; here a timer lowers the usage.
"""

from __future__ import annotations

import os
import threading

import pytest

from slime.sandbox import run_memory
from slime.sandbox.run_memory import LimitNotApplied, RunMemory

MB = 1 << 20


class Dropper:
    def __init__(self):
        self.waited = 0

    def wait_idle(self):
        self.waited += 1


class Slot:
    def __init__(self, tmp_path, usage: int):
        self.paths = {n: tmp_path / n for n in ("limit", "usage")}
        self.paths["limit"].write_text(str(64 * MB))  # (8 digits as 32 MB's: pwrite does not truncate)
        self.set_usage(usage)
        self.cg_limit_fds = [os.open(self.paths["limit"], os.O_RDWR)]
        self.cg_usage_fds = [os.open(self.paths["usage"], os.O_RDONLY)]
        self.cg_oom_fds = []

    def set_usage(self, usage: int):
        self.paths["usage"].write_text(f"{usage:<20}")  # fixed width: the open fd reads the new value in place

    def close(self):
        for fd in self.cg_limit_fds + self.cg_usage_fds:
            os.close(fd)


class Init(RunMemory):
    def __init__(self, slot):
        self.slot, self.mem_limit, self.dropper = slot, 64 * MB, Dropper()

    def _dropper(self):
        return self.dropper


@pytest.fixture
def slot(tmp_path):
    s = Slot(tmp_path, usage=200 * MB)  # the previous run's 200 MB of /tmp files
    yield s
    s.close()


def test_a_lower_limit_waits_for_the_previous_runs_pages(slot):
    init = Init(slot)
    threading.Timer(0.05, slot.set_usage, [1 * MB]).start()  # uncharged a little after the drop
    init._set_memory(32 * MB)
    assert init.dropper.waited == 1 and init.mem_limit == 32 * MB
    assert int(slot.paths["limit"].read_text()) == 32 * MB


def test_pages_never_released_refuse_the_run_after_the_wait(slot, monkeypatch):
    monkeypatch.setattr(run_memory, "RELEASE_WAIT_S", 0.1)
    init = Init(slot)
    with pytest.raises(LimitNotApplied, match=r"32 MB could not be applied \(200 MB still in use by the previous run"):
        init._set_memory(32 * MB)
    assert init.mem_limit is None  # only a limit read back as written is remembered


def test_a_limit_that_holds_at_once_does_not_wait(slot):
    slot.set_usage(1 * MB)
    init = Init(slot)
    init._set_memory(32 * MB)
    assert init.dropper.waited == 0 and init.mem_limit == 32 * MB
