"""Per-slot cgroups: memory (tmpfs included), processes and CPU of a run bounded as a whole.

cgroup v2 (a unified hierarchy with the memory/pids/cpu controllers) or v1 (one hierarchy per
controller), whichever the host offers (v2 first; a hybrid host whose cgroup2 mount lacks memory
and pids uses v1). Each server makes ``slime-sandbox-<pid>/slot-<i>`` (processes and CPU of the
whole slot) with a child ``run`` that holds the run's memory limit; a slot's fork server and init
stay outside ``run`` (v2: in ``sup``, a sibling), and each program joins ``run`` right after its
fork, so nothing a run does to its memory can kill its supervisors. Leftovers of servers that died
(SIGKILL) are removed at the next start (they are empty: their runs died with them).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)
PREFIX = "slime-sandbox-"


@dataclass
class SlotCgroup:
    """Files of one slot, in the order the fork server uses them: it joins `procs`, enters its
    cgroup namespace, moves to `sup_procs` and writes `enable` (v2: a cgroup with processes cannot
    enable controllers for its children, so the slot's own is enabled once it is empty); each
    program joins `run_procs`; the init writes `limits` (the run's) and reads `oom` and `usage`."""

    procs: list[str] = field(default_factory=list)  # cgroup.procs files the fork server joins first
    sup_procs: list[str] = field(default_factory=list)  # then these (v2: slot-i/sup), inside its namespace
    enable: list[tuple[str, str]] = field(default_factory=list)  # (file, value) written after that
    run_procs: list[str] = field(default_factory=list)  # cgroup.procs each program joins
    limits: list[str] = field(default_factory=list)  # the run's memory limit files (v1: limit, then memsw)
    oom: list[str] = field(default_factory=list)  # files with an "oom_kill N" line (the run's)
    usage: list[str] = field(default_factory=list)  # the run's current memory usage
    dirs: list[str] = field(default_factory=list)  # deepest first (removal order)


@dataclass
class CgroupHost:
    """Where the host's cgroup hierarchies are mounted and where this process sits in each (read
    from /proc by `current()`; tests describe a fake one laid out in a temporary directory)."""

    mounts: list[tuple[str, str, set[str]]]  # (fstype "cgroup"/"cgroup2", mount point, mount options)
    paths: dict[str, str]  # "0" (the v2 hierarchy) or a v1 controller -> our cgroup's path in it

    @classmethod
    def current(cls) -> "CgroupHost":
        mounts = []
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fstype, _src, opts = (right.split() + ["", "", ""])[:3]
                if fstype in ("cgroup", "cgroup2"):
                    mounts.append((fstype, left.split()[4], set(opts.split(","))))
        paths = {}
        with open("/proc/self/cgroup") as f:
            for line in f:
                hid, ctrls, path = line.rstrip("\n").split(":", 2)
                for key in (["0"] if hid == "0" else []) + [c for c in ctrls.split(",") if c]:
                    paths[key] = path
        return cls(mounts, paths)

    def own_path(self, controller: str | None) -> str:
        return self.paths.get(controller or "0", "/")


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class Cgroups:
    """Creates and removes the slot cgroups of one server. `kind` is "v2", "v1" or None."""

    def __init__(self, slots: int, max_pids: int, cpus: float, host: CgroupHost | None = None) -> None:
        self.kind: str | None = None
        self.bases: list[str] = []
        self.slots: list[SlotCgroup] = [SlotCgroup() for _ in range(slots)]
        self.missing: list[str] = []
        if slots == 0:  # (runs without isolation: nothing to create)
            return
        if host is None and os.geteuid() != 0:
            self.missing = ["memory", "processes", "cpu"]
            return
        self.host = host or CgroupHost.current()
        try:
            self._setup(slots, max_pids, cpus)
        except OSError as e:
            logger.warning("cgroups unusable (%s)", e)
            self.close()
            self.kind, self.slots = None, [SlotCgroup() for _ in range(slots)]
            self.missing = ["memory", "processes", "cpu"]

    def _setup(self, slots: int, max_pids: int, cpus: float) -> None:
        mounts = self.host.mounts
        v2 = next((m for f, m, _ in mounts if f == "cgroup2"), None)
        v2_ctrls: set[str] = set()
        if v2:
            with contextlib.suppress(OSError), open(os.path.join(v2, "cgroup.controllers")) as f:
                v2_ctrls = set(f.read().split())
        if {"memory", "pids"} <= v2_ctrls:
            self._setup_v2(v2, v2_ctrls, slots, max_pids, cpus)
            return
        v1 = {c: m for f, m, opts in mounts if f == "cgroup" for c in ("memory", "pids", "cpu") if c in opts}
        if not v1:
            self.missing = ["memory", "processes", "cpu"]
            return
        self.kind = "v1"
        self.missing = [n for c, n in (("memory", "memory"), ("pids", "processes"), ("cpu", "cpu")) if c not in v1]
        for ctrl, mnt in v1.items():
            parent = os.path.join(mnt, self.host.own_path(ctrl).lstrip("/"))
            _clean_stale(parent)
            base = os.path.join(parent, f"{PREFIX}{os.getpid()}")
            os.makedirs(base, exist_ok=True)
            self.bases.append(base)
            if ctrl == "cpu":  # the group competes for CPU as its N slots would as N processes
                with contextlib.suppress(OSError):
                    _write(os.path.join(base, "cpu.shares"), str(1024 * max(1, slots)))
            for i, sc in enumerate(self.slots):
                d = os.path.join(base, f"slot-{i}")
                os.makedirs(d, exist_ok=True)
                sc.procs.append(os.path.join(d, "cgroup.procs"))
                if ctrl == "memory":  # (v1: only memory needs the run apart; pids and cpu bound the slot)
                    run = os.path.join(d, "run")
                    os.makedirs(run, exist_ok=True)
                    sc.dirs.append(run)
                    sc.run_procs.append(os.path.join(run, "cgroup.procs"))
                    sc.limits.append(os.path.join(run, "memory.limit_in_bytes"))
                    if os.path.exists(os.path.join(run, "memory.memsw.limit_in_bytes")):
                        sc.limits.append(os.path.join(run, "memory.memsw.limit_in_bytes"))
                    sc.oom.append(os.path.join(run, "memory.oom_control"))
                    sc.usage.append(os.path.join(run, "memory.usage_in_bytes"))
                elif ctrl == "pids":
                    _write(os.path.join(d, "pids.max"), str(max_pids))
                elif ctrl == "cpu" and cpus > 0:
                    with open(os.path.join(d, "cpu.cfs_period_us")) as f:
                        period = int(f.read())
                    _write(os.path.join(d, "cpu.cfs_quota_us"), str(int(period * cpus)))
                sc.dirs.append(d)

    def _setup_v2(self, mnt: str, ctrls: set[str], slots: int, max_pids: int, cpus: float) -> None:
        want = [c for c in ("memory", "pids", "cpu") if c in ctrls]
        # a v2 cgroup with processes cannot delegate controllers: use ours if it can, else the root
        last: OSError | None = None
        ours = os.path.normpath(os.path.join(mnt, self.host.own_path(None).lstrip("/")))
        for parent in dict.fromkeys((ours, mnt)):
            _clean_stale(parent)
            base = os.path.join(parent, f"{PREFIX}{os.getpid()}")
            try:
                _write(os.path.join(parent, "cgroup.subtree_control"), " ".join("+" + c for c in want))
                os.makedirs(base, exist_ok=True)
                _write(os.path.join(base, "cgroup.subtree_control"), " ".join("+" + c for c in want))
                break
            except OSError as e:
                last = e
                with contextlib.suppress(OSError):
                    os.rmdir(base)
        else:
            raise last or OSError("no usable cgroup v2 parent")
        self.kind = "v2"
        self.bases.append(base)
        if "cpu" in want:  # the group competes for CPU as its N slots would as N processes
            with contextlib.suppress(OSError):
                _write(os.path.join(base, "cpu.weight"), str(min(10000, 100 * max(1, slots))))
        self.missing = [] if "cpu" in want else ["cpu"]
        for i, sc in enumerate(self.slots):
            d = os.path.join(base, f"slot-{i}")
            run, sup = os.path.join(d, "run"), os.path.join(d, "sup")
            for sub in (run, sup):
                os.makedirs(sub, exist_ok=True)
            sc.dirs += [run, sup, d]
            sc.procs.append(os.path.join(d, "cgroup.procs"))
            sc.sup_procs.append(os.path.join(sup, "cgroup.procs"))
            sc.enable.append((os.path.join(d, "cgroup.subtree_control"), "+memory"))
            sc.run_procs.append(os.path.join(run, "cgroup.procs"))
            sc.limits.append(os.path.join(run, "memory.max"))
            sc.oom.append(os.path.join(run, "memory.events"))
            sc.usage.append(os.path.join(run, "memory.current"))
            with contextlib.suppress(OSError):
                _write(os.path.join(d, "memory.swap.max"), "0")
            _write(os.path.join(d, "pids.max"), str(max_pids))
            if "cpu" in want and cpus > 0:
                _write(os.path.join(d, "cpu.max"), f"{int(100000 * cpus)} 100000")

    def close(self, wait: float = 2.0) -> None:
        """Remove our cgroups (their processes must be gone: the fork servers are stopped first).
        A slot's init may still be exiting when its fork server is reaped: a cgroup still busy is
        tried again for up to `wait` seconds (cgroup v1 has no event for "empty"), then left to
        the next server's start, which removes the leftovers of dead servers."""
        import errno
        import time

        deadline = time.monotonic() + wait
        for d in [d for sc in self.slots for d in sc.dirs] + self.bases:
            while True:
                try:
                    os.rmdir(d)
                except OSError as e:
                    if e.errno == errno.EBUSY and time.monotonic() < deadline:
                        time.sleep(0.01)
                        continue
                break
        self.bases = []


def _clean_stale(parent: str) -> None:
    """Remove the empty cgroups of sandbox servers that are no longer alive."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for n in names:
        if not n.startswith(PREFIX) or not n[len(PREFIX) :].isdigit():
            continue
        pid = int(n[len(PREFIX) :])
        if pid == os.getpid() or os.path.exists(f"/proc/{pid}"):
            continue
        for root, dirs, _ in os.walk(os.path.join(parent, n), topdown=False):
            for d in dirs:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(root, d))
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(parent, n))
