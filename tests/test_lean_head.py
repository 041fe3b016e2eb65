"""Issue 31, item 6: the private Ray a command starts (`slime.ray.session.ray_init`) runs without the
autoscaler monitor, the dashboard's API server and prestarted idle workers, with a stand-in for a dashboard
agent that would serve nothing (slime.ray.lean_head, slime.ray.idle_dashboard_agent), and what a
run uses of Ray still works: an actor's log reaches the command (the log monitor is kept), placement groups,
the GCS's records of nodes and actors (slime.fleet.lost_nodes), and the stop leaves nothing running.

One fresh interpreter starts the Ray (this session's own Ray, tests/conftest.py, would be joined instead)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from slime.testing.processes import processes_naming

ROOT = Path(__file__).resolve().parents[1]

# starts a private Ray as slime's commands do, runs one actor in a placement group, and reports what it saw
RUN = r"""
import json, sys, threading
from types import SimpleNamespace

import psutil
import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import ray._private.node as ray_node
from slime.ray.session import ray_init
from slime.testing.processes import cmdline, processes_naming

node_class = ray_node.Node
heard = threading.Event()


class Listening:  # the command's stderr, noting when the actor's line relayed by Ray arrives

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        if "lean-head-marker" in text:
            heard.set()
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


sys.stderr = Listening(sys.stderr)
session = ray_init(SimpleNamespace(ray_address=None, rollout_backend="sglang"))
dashboard_modules_imported = "aiohttp.web" in sys.modules  # (before this script's own check below imports them)
try:
    pg = placement_group([{"CPU": 1}])
    ray.get(pg.ready(), timeout=120)

    @ray.remote(num_cpus=1)
    class Speaker:
        def say(self, word):
            print(word, file=sys.stderr, flush=True)
            return word

    speaker = Speaker.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote()
    ray.get(speaker.say.remote("lean-head-marker"), timeout=120)
    ours = {p.pid: cmdline(p) for p in processes_naming(session.ray_tmp)}
    ours.update({p.pid: cmdline(p) for p in psutil.Process().children(recursive=True)})
    facts = {
        "ray_tmp": str(session.ray_tmp),
        "processes": sorted(ours.values()),
        "alive_nodes": sum(1 for n in ray.nodes() if n["Alive"]),
        "actor_state": ray._private.state.actors(speaker._actor_id.hex())["State"],
        "node_class_restored": ray_node.Node is node_class,
        "agent_would_be_minimal": ray._private.utils.get_dashboard_dependency_error() is not None,
        "dashboard_modules_imported": dashboard_modules_imported,
        "port_files": {p.name.rsplit("_", 1)[0]: p.read_text() for p in session.ray_tmp.glob("session_*/*_port_*")},
        "actor_log_reached_the_command": heard.wait(120),  # through the log monitor, asynchronously
    }
finally:
    session.stop()
print("FACTS " + json.dumps(facts), flush=True)
"""

AGENT_TITLES = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


def _is_worker(command: str) -> bool:
    """A Ray worker: titled by Ray (`ray::IDLE`, `ray::<Actor>`), or not yet (`python .../default_worker.py`)."""
    argv = command.split()
    if command.startswith("ray::"):
        return not command.startswith(AGENT_TITLES)
    return len(argv) > 1 and argv[1].endswith("default_worker.py")


def test_a_commands_private_ray_starts_lean_and_still_serves_a_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", RUN], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout.split("FACTS ", 1)[1])
    procs = facts["processes"]

    def running(script: str) -> list[str]:
        return [c for c in procs if script in c]

    # not started: the autoscaler monitor, the dashboard's API server
    assert running("autoscaler/_private/monitor.py") == []
    assert running("dashboard/dashboard.py") == []
    # kept: the GCS, the raylet, its two agents, the log monitor
    for kept in ("gcs_server", "raylet/raylet", "runtime_env/agent/main.py", "log_monitor.py"):
        assert running(kept), f"{kept} is not running: {procs}"
    # the dashboard agent: the stand-in where Ray's would run `--minimal` (serving nothing), else Ray's own
    rays_agent = [c for c in running("dashboard/agent.py") if "idle_dashboard_agent.py" not in c]
    if facts["agent_would_be_minimal"]:
        assert running("slime/ray/idle_dashboard_agent.py") and not rays_agent, procs
        ports = facts["port_files"]  # what the raylet waited for before registering its node: "not in use"
        for name in ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port"):
            assert ports[name] == "-1", ports
        assert int(ports["runtime_env_agent_port"]) > 0  # the real agent's, beside them
        assert not facts["dashboard_modules_imported"]  # found missing without importing the others
    else:
        assert rays_agent and not running("idle_dashboard_agent.py"), procs
    # one worker, the actor's: none prestarted and left idle
    workers = [c for c in procs if _is_worker(c)]
    assert len(workers) == 1 and workers[0].startswith("ray::Speaker"), workers
    # what a run uses still works
    assert facts["actor_log_reached_the_command"]  # log_to_driver: the log monitor is kept
    assert facts["alive_nodes"] == 1 and facts["actor_state"] == "ALIVE"
    assert facts["node_class_restored"]  # only the start was patched: a later `Cluster` node is Ray's own
    # and the stop took everything down
    assert processes_naming(facts["ray_tmp"]) == []


def test_a_missing_dependency_is_found_without_importing_any(tmp_path, monkeypatch):
    from slime.ray.lean_head import first_missing_module

    (tmp_path / "present_here_only.py").write_text("raise AssertionError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert first_missing_module("import json\nimport present_here_only\nfrom no_such_module_x import y\n") == (
        "no_such_module_x"
    )
    assert first_missing_module("import os.path\nfrom present_here_only import z\nx = 1\n") is None
    assert "present_here_only" not in sys.modules
    assert first_missing_module("from . import sibling\nimport no_such_module_y.sub\n") == "no_such_module_y"


def test_stop_manager_returns_after_its_import_thread_is_done(tmp_path, monkeypatch):
    """The import `stop_manager` overlaps with the manager's stop (Ray's compiled-graph modules) is over when
    it returns: a thread still importing beside whatever runs next creates loggers while, for one, pytest's
    logging plugin walks `loggerDict` ("dictionary changed size during iteration")."""
    import time
    from types import SimpleNamespace

    import ray

    import slime.ray.session as session

    (tmp_path / "slow_shutdown_import.py").write_text(
        "import logging, time\ntime.sleep(0.5)\nlogger = logging.getLogger('slow_shutdown_import')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(session, "_RAY_SHUTDOWN_IMPORTS", "slow_shutdown_import")
    stopped = []
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: stopped.append(ref))  # the manager stops at once
    monkeypatch.setattr(ray, "kill", lambda actor: None)
    manager = SimpleNamespace(shutdown=SimpleNamespace(remote=lambda: "shutdown-ref"))
    t = time.monotonic()
    session.stop_manager(manager)
    assert stopped == ["shutdown-ref"]
    module = sys.modules["slow_shutdown_import"]  # (there from the import's start)
    assert hasattr(module, "logger") and time.monotonic() - t >= 0.5  # its last line ran: the import is over
    sys.modules.pop("slow_shutdown_import", None)
