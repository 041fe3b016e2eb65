"""The sandbox's cgroup code paths. v2 runs against a temporary directory laid out like a cgroup2
mount on every host (which files get written, with which values), and for real where the host
offers cgroup v2 with the memory and pids controllers; the per-run writes of the slot's init
(memory limit, OOM kill count) run against files laid out like both versions' (no server needed)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from slime.sandbox.cgroups import PREFIX, CgroupHost, Cgroups


def _fake_v2(tmp_path, controllers=("cpuset", "cpu", "io", "memory", "hugetlb", "pids"), own="/work.slice"):
    root = tmp_path / "cgroup2"
    root.mkdir()
    (root / "cgroup.controllers").write_text(" ".join(controllers) + "\n")
    (root / "cgroup.subtree_control").write_text("")
    (root / own.lstrip("/")).mkdir()
    (root / own.lstrip("/") / "cgroup.subtree_control").write_text("")
    return root, CgroupHost([("cgroup2", str(root), {"rw", "nosuid"})], {"0": own})


def _files(root) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_v2_layout_and_values(tmp_path):
    root, host = _fake_v2(tmp_path)
    cg = Cgroups(2, 68, 1.5, host=host)
    assert (cg.kind, cg.missing) == ("v2", [])
    base = f"work.slice/{PREFIX}{os.getpid()}"
    slot = {
        f"{base}/slot-{i}/{name}": value
        for i in range(2)
        for name, value in (("cpu.max", "150000 100000"), ("memory.swap.max", "0"), ("pids.max", "68"))
    }
    assert _files(root) == {
        "cgroup.controllers": "cpuset cpu io memory hugetlb pids\n",
        "cgroup.subtree_control": "",
        "work.slice/cgroup.subtree_control": "+memory +pids +cpu",
        f"{base}/cgroup.subtree_control": "+memory +pids +cpu",
        f"{base}/cpu.weight": "200",
        **slot,
    }
    d = root / base / "slot-1"  # the fork server joins the slot, then `sup`; programs join `run`
    assert cg.slots[1].procs == [str(d / "cgroup.procs")] and cg.slots[1].sup_procs == [str(d / "sup/cgroup.procs")]
    assert cg.slots[1].enable == [(str(d / "cgroup.subtree_control"), "+memory")]
    assert cg.slots[1].run_procs == [str(d / "run/cgroup.procs")] and cg.slots[1].limits == [str(d / "run/memory.max")]
    assert cg.slots[1].oom == [str(d / "run/memory.events")] and cg.slots[1].usage == [str(d / "run/memory.current")]
    assert cg.slots[1].dirs == [str(d / "run"), str(d / "sup"), str(d)]


def test_v2_without_the_cpu_controller_says_so(tmp_path):
    root, host = _fake_v2(tmp_path, controllers=("memory", "pids"))
    cg = Cgroups(1, 10, 1.0, host=host)
    assert (cg.kind, cg.missing) == ("v2", ["cpu"])
    base = f"work.slice/{PREFIX}{os.getpid()}"
    assert _files(root)[f"{base}/cgroup.subtree_control"] == "+memory +pids"
    assert not (root / base / "slot-0" / "cpu.max").exists() and not (root / base / "cpu.weight").exists()


def test_v2_uses_the_root_when_our_own_cgroup_cannot_delegate(tmp_path):
    root, host = _fake_v2(tmp_path)  # (a v2 cgroup with processes refuses subtree_control: EBUSY)
    (root / "work.slice" / "cgroup.subtree_control").unlink()
    (root / "work.slice" / "cgroup.subtree_control").mkdir()  # writing it now fails with an OSError
    cg = Cgroups(1, 10, 1.0, host=host)
    assert cg.kind == "v2" and cg.bases == [str(root / f"{PREFIX}{os.getpid()}")]
    assert _files(root)["cgroup.subtree_control"] == "+memory +pids +cpu"


def test_stale_cgroups_of_dead_servers_are_removed(tmp_path):
    root, host = _fake_v2(tmp_path)
    dead = root / "work.slice" / f"{PREFIX}999999999"
    (dead / "slot-0").mkdir(parents=True)
    Cgroups(1, 10, 1.0, host=host)
    assert not dead.exists()


def test_hybrid_host_without_v2_memory_falls_back_to_v1(tmp_path):
    v2 = tmp_path / "unified"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("hugetlb\n")
    mem, pids = tmp_path / "memory", tmp_path / "pids"
    for d in (mem, pids):
        (d / "sandbox").mkdir(parents=True)
    host = CgroupHost(
        [("cgroup2", str(v2), {"rw"}), ("cgroup", str(mem), {"rw", "memory"}), ("cgroup", str(pids), {"rw", "pids"})],
        {"0": "/", "memory": "/sandbox", "pids": "/sandbox"},
    )
    cg = Cgroups(1, 12, 1.0, host=host)
    assert (cg.kind, cg.missing) == ("v1", ["cpu"])
    slot = f"sandbox/{PREFIX}{os.getpid()}/slot-0"
    assert _files(pids) == {f"{slot}/pids.max": "12"}
    # (v1: only the memory hierarchy has the run apart; the fork server stays in the slot in all of them)
    assert cg.slots[0].procs == [str(mem / slot / "cgroup.procs"), str(pids / slot / "cgroup.procs")]
    assert cg.slots[0].run_procs == [str(mem / slot / "run/cgroup.procs")] and not cg.slots[0].sup_procs
    assert cg.slots[0].limits == [str(mem / slot / "run/memory.limit_in_bytes")]
    assert cg.slots[0].oom == [str(mem / slot / "run/memory.oom_control")]


def _init_with(limit_files, oom_files, usage_files=()):
    from slime.sandbox.run_init import RunInit

    slot = SimpleNamespace(
        isolate=False,
        cg_limit_fds=[os.open(p, os.O_RDWR) for p in limit_files],
        cg_oom_fds=[os.open(p, os.O_RDONLY) for p in oom_files],
        cg_usage_fds=[os.open(p, os.O_RDONLY) for p in usage_files],
    )
    return RunInit(slot, ctl=None, forker=None), slot


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_the_init_writes_each_steps_memory_limit_and_reads_oom_kills(tmp_path, version):
    if version == "v2":
        limits, oom = [tmp_path / "memory.max"], tmp_path / "memory.events"
        oom_text = "low 0\nhigh 0\nmax 7\noom 2\noom_kill {}\noom_group_kill 0\n"
    else:  # the memory+swap limit must stay >= the limit: both are written, in an order that works both ways
        limits, oom = (
            [tmp_path / "memory.limit_in_bytes", tmp_path / "memory.memsw.limit_in_bytes"],
            tmp_path / "memory.oom_control",
        )
        oom_text = "oom_kill_disable 0\nunder_oom 0\noom_kill {}\n"
    for p in limits:
        p.write_text("0")
    oom.write_text(oom_text.format(3))
    init, slot = _init_with(limits, [oom])
    try:
        init._set_memory(300 << 20)
        assert [p.read_text() for p in limits] == [str(300 << 20)] * len(limits)
        assert init._oom_kills() == 3
        oom.write_text(oom_text.format(5))  # (the kernel's count goes up: read again from the start)
        assert init._oom_kills() == 5
    finally:
        for fd in slot.cg_limit_fds + slot.cg_oom_fds + slot.cg_usage_fds:
            os.close(fd)


@pytest.mark.parametrize("freed_by_the_dropper", [True, False])
def test_a_lower_limit_is_verified_retried_after_the_drop_and_never_cached_unapplied(tmp_path, freed_by_the_dropper):
    """Item 2 of issue 21: the limit is written, read back, retried once the previous runs'
    namespaces are gone, and only a limit that holds is remembered; else the run does not start."""
    from slime.sandbox.run_init import LimitNotApplied

    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    limit.write_text("max")  # (a file: a shorter value written at 0 must not leave a tail behind)
    usage.write_text(str(300 << 20))  # the previous run's tmpfs, still charged
    init, slot = _init_with([limit], [], [usage])
    init.mem_limit = 4096 << 20
    dropped = []

    class Dropper:
        def wait_idle(self):
            dropped.append(True)
            if freed_by_the_dropper:
                usage.write_text(str(1 << 20))

    init.drop_queue = Dropper()
    try:
        if freed_by_the_dropper:
            init._set_memory(32 << 20)
            assert (limit.read_text(), init.mem_limit, dropped) == (str(32 << 20), 32 << 20, [True])
        else:
            with pytest.raises(
                LimitNotApplied, match=r"memory limit of 32 MB could not be applied \(300 MB still in use"
            ):
                init._set_memory(32 << 20)
            assert init.mem_limit is None and dropped == [True]  # (the next run tries again)
    finally:
        for fd in slot.cg_limit_fds + slot.cg_usage_fds:
            os.close(fd)


def _real_v2_missing() -> str:
    """Why this host cannot run the real v2 test ('' when it can)."""
    if not os.path.exists("/proc/self/mountinfo"):
        return "no /proc (not Linux)"
    host = CgroupHost.current()
    mounts = [m for f, m, _ in host.mounts if f == "cgroup2"]
    if not mounts:
        return "no cgroup2 filesystem is mounted"
    try:
        with open(os.path.join(mounts[0], "cgroup.controllers")) as f:
            ctrls = set(f.read().split())
    except OSError as e:
        return f"cannot read {mounts[0]}/cgroup.controllers: {e}"
    if not {"memory", "pids"} <= ctrls:
        return (
            f"the cgroup2 mount at {mounts[0]} offers {', '.join(sorted(ctrls)) or 'no controller'}: memory and "
            "pids are missing (on this host they are bound to cgroup v1 hierarchies)"
        )
    if os.geteuid() != 0:
        return "creating cgroups needs root"
    return ""


REAL_V2_MISSING = _real_v2_missing()


@pytest.mark.skipif(bool(REAL_V2_MISSING), reason=REAL_V2_MISSING or "-")
def test_v2_for_real():
    cg = Cgroups(2, 40, 1.0)
    try:
        assert cg.kind == "v2"
        for sc in cg.slots:
            d = sc.dirs[0]
            with open(os.path.join(d, "pids.max")) as f:
                assert f.read().strip() == "40"
            with open(os.path.join(d, "memory.max")) as f:
                assert f.read().strip() == "max"  # (each step's limit is written by the init)
            if "cpu" not in cg.missing:
                with open(os.path.join(d, "cpu.max")) as f:
                    assert f.read().strip() == "100000 100000"
    finally:
        cg.close()
    assert not [d for sc in cg.slots for d in sc.dirs if os.path.exists(d)]
