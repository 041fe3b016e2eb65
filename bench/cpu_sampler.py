"""CPU seconds of a command's process tree, per component and per phase, for start-up benchmarks.

Why: on a shared 2-core box the wall time of a cold start says more about the other tenants than
about us; the CPU each part of a run burns (Ray's daemons and agents, its workers, the engine fork
server, the engines, the driver) does not. A thread walks the command's descendants every `period`
seconds and keeps each process's last user+system CPU; a process's CPU is known up to its last
sample (at most `period` of it is missed when it exits). `phases()` splits the totals by the time
windows between trace milestones (slime.utils.startup_trace).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import psutil


def component(proc: psutil.Process, root_pid: int, fork_server_pids: set[int]) -> str:
    """Which part of the run a process is, from its command line (Ray's titles included)."""
    try:
        cmd = " ".join(proc.cmdline())
        name = proc.name()
        ppid = proc.ppid()
    except psutil.Error:
        return "?"
    if not cmd:  # a zombie's command line reads empty: it keeps the name it had
        return "?"
    if proc.pid == root_pid:
        return "driver (the command)"
    if "slime.utils.fork_server" in cmd:
        fork_server_pids.add(proc.pid)
        return "engine fork server (preload)"
    if ppid in fork_server_pids:
        return "engines (forked)"
    if cmd.startswith("ray::"):  # a title Ray gave the process
        title = cmd.split()[0]
        return (
            f"ray worker {title}"
            if title not in ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
            else f"ray: {title[5:]}"
        )
    for needle, label in (
        ("gcs_server", "ray: gcs_server"),
        ("raylet/raylet", "ray: raylet"),
        ("idle_dashboard_agent.py", "ray: dashboard agent's stand-in"),
        ("dashboard/agent.py", "ray: dashboard agent"),
        ("runtime_env/agent", "ray: runtime env agent"),
        ("log_monitor", "ray: log monitor"),
        ("monitor.py", "ray: monitor"),
        ("dashboard.py", "ray: dashboard"),
        ("process_keeper", "ray process keeper"),
        ("sglang", "router"),
        ("router", "router"),
    ):
        if needle in cmd or needle == name:
            return label
    if "default_worker.py" in cmd:
        return "ray worker ray::IDLE"
    try:
        if ppid == root_pid and cmd == " ".join(psutil.Process(root_pid).cmdline()):
            return "driver's fork (lifeline)"
    except psutil.Error:
        pass
    return (cmd or name or "?")[:70]


class CpuSampler:
    """Samples `root_pid` and its descendants until `stop()`; `totals()` and `phases()` afterwards."""

    def __init__(self, root_pid: int, period: float = 0.2):
        self.root_pid, self.period = root_pid, period
        self.cpu: dict[int, float] = {}  # pid -> last user+system seconds seen
        self.label: dict[int, str] = {}  # pid -> its component (the last title seen: Ray renames its workers)
        self.ticks: list[tuple[float, dict[int, float]]] = []  # (unix time, cpu per pid so far)
        self._fork_servers: set[int] = set()
        self._stop = threading.Event()
        self._procs: dict[int, psutil.Process] = {}
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()

    def _tree(self) -> list[psutil.Process]:
        try:
            root = self._procs.setdefault(self.root_pid, psutil.Process(self.root_pid))
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def _run(self) -> None:
        while not self._stop.is_set():
            for p in self._tree():
                p = self._procs.setdefault(p.pid, p)  # one Process object per pid: cpu_times() reads /proc
                try:
                    t = p.cpu_times()
                except psutil.Error:
                    continue
                self.cpu[p.pid] = t.user + t.system
                label = component(p, self.root_pid, self._fork_servers)
                if label != "?" or p.pid not in self.label:  # a process being reaped keeps the name it had
                    self.label[p.pid] = label
            self.ticks.append((time.time(), dict(self.cpu)))
            self._stop.wait(self.period)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for pid, cpu in self.cpu.items():
            out[self.label.get(pid, "?")] += cpu
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def _at(self, t: float) -> dict[int, float]:
        """CPU per pid at the last tick not after `t`."""
        best: dict[int, float] = {}
        for when, cpu in self.ticks:
            if when > t:
                break
            best = cpu
        return best

    def phases(self, edges: list[tuple[float, str]]) -> list[tuple[str, float, dict[str, float]]]:
        """For each window between consecutive `edges` (unix time, name): (window name, wall seconds,
        CPU seconds per component in it)."""
        out = []
        for (t0, a), (t1, b) in zip(edges, edges[1:]):
            c0, c1 = self._at(t0), self._at(t1)
            per: dict[str, float] = defaultdict(float)
            for pid, cpu in c1.items():
                d = cpu - c0.get(pid, 0.0)
                if d > 0.005:
                    per[self.label.get(pid, "?")] += d
            out.append((f"{a} -> {b}", t1 - t0, dict(sorted(per.items(), key=lambda kv: -kv[1]))))
        return out
