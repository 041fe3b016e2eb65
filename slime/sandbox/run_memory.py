"""A run's memory limit and OOM count, through the slot's cgroup files opened by the fork server (stdlib
only: loaded by the fork server with `run_init.py`)."""

import os
import time

RELEASE_WAIT_S = 5.0  # how long a lower limit waits for the previous runs' pages to be uncharged


class LimitNotApplied(RuntimeError):
    """A run's limit could not be set: the run must not start."""


class RunMemory:
    """`RunInit`'s part that sets each step's memory limit (`_set_memory`) and counts OOM kills. Needs of
    its host: ``slot`` (``cg_limit_fds``, ``cg_usage_fds``, ``cg_oom_fds``), ``mem_limit`` (the limit
    last applied, or None) and ``_dropper()`` (the namespace dropper, to wait for the previous runs' pages)."""

    def _set_memory(self, limit_bytes):
        """Apply the run's memory limit or raise `LimitNotApplied`: the run must not start with
        another run's limit. Lowering it fails (v1: EBUSY; v2: usage stays above) while the
        previous runs' tmpfs pages still count: then wait until they are released
        (`_write_after_release`). Only a limit read back as written is remembered."""
        if limit_bytes == self.mem_limit or not self.slot.cg_limit_fds:
            return
        self.mem_limit = None
        why = self._write_memory(limit_bytes)
        if why:
            why = self._write_after_release(limit_bytes)
        if why:
            raise LimitNotApplied("the memory limit of %d MB could not be applied (%s)" % (limit_bytes >> 20, why))
        self.mem_limit = limit_bytes

    def _write_after_release(self, limit_bytes):
        """Write the limit again once the previous runs' namespaces are dropped, retried with a
        growing pause for up to RELEASE_WAIT_S: their tmpfs pages are uncharged a little after the
        last reference goes (the unmount is deferred; 20-50 ms seen on a loaded 2-core box, where
        one write right after the drop failed 9 times in 30), and cgroup v2 has no event for usage
        falling. None when it holds, else why not."""
        self._dropper().wait_idle()
        deadline, pause = time.monotonic() + RELEASE_WAIT_S, 0.005
        while True:
            why = self._write_memory(limit_bytes)
            if not why or time.monotonic() >= deadline:
                return why
            time.sleep(pause)
            pause = min(2 * pause, 0.2)

    def _write_memory(self, limit_bytes):
        """Write the limit (v1: memsw must stay >= the limit: memsw, limit, memsw again works both
        ways), read it back; None when it holds, else why not."""
        fds, value, errors = self.slot.cg_limit_fds, str(limit_bytes).encode(), []
        for fd in fds[1:] + fds + fds[1:]:
            try:
                os.pwrite(fd, value, 0)
            except OSError as e:
                errors.append(e.strerror or str(e))
        for fd in fds:
            try:
                got = os.pread(fd, 64, 0).strip()
            except OSError as e:
                return "cannot read it back: %s" % (e.strerror or e)
            if got != value:
                return "it reads %s%s" % (got.decode(errors="replace"), ", " + errors[-1] if errors else "")
        usage = self._memory_usage()
        if usage is not None and usage > limit_bytes:
            return "%d MB still in use by the previous run" % (usage >> 20)
        return None

    def _memory_usage(self):
        for fd in self.slot.cg_usage_fds:
            try:
                return int(os.pread(fd, 64, 0).split()[0])
            except (OSError, ValueError, IndexError):
                pass
        return None

    def _oom_kills(self):
        n = 0
        for fd in self.slot.cg_oom_fds:
            try:
                for line in os.pread(fd, 4096, 0).decode().splitlines():
                    k, _, v = line.partition(" ")
                    if k == "oom_kill":
                        n += int(v)
            except (OSError, ValueError):
                pass
        return n
