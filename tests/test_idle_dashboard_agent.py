"""The dashboard agent's stand-in (slime.ray.idle_dashboard_agent) on its own, started as a raylet starts its
agent: it writes the ports the raylet waits for, lives exactly as long as the pipe on its stdin, and on a
command line it does not know becomes the agent it stands in for. A whole Ray started with it:
tests/test_lean_head.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slime.ray import idle_dashboard_agent
from slime.ray.idle_dashboard_agent import PORT_NAMES_FLAG
from slime.testing.until import until

SCRIPT = Path(idle_dashboard_agent.__file__).resolve()
NAMES = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port")


def _start(argv: list[str], stdin=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-S", "-u", str(SCRIPT), *argv], stdin=stdin, stdout=subprocess.PIPE)


def test_it_writes_the_ports_as_not_in_use_and_ends_with_the_raylets_pipe(tmp_path):
    node = "ab" * 28
    argv = [PORT_NAMES_FLAG + ",".join(NAMES), "/ray/dashboard/agent.py", f"--node-id={node}"]
    proc = _start([*argv, f"--session-dir={tmp_path}", "--node-manager-port=RAY_NODE_MANAGER_PORT_PLACEHOLDER"])
    try:
        files = [tmp_path / f"{name}_{node}" for name in NAMES]
        assert until(lambda: all(f.exists() for f in files) or proc.poll() is not None, timeout=60), "no ports"
        assert proc.poll() is None, "the stand-in ended before writing its ports"
        assert [f.read_text() for f in files] == ["-1"] * 3
        assert not list(tmp_path.glob("*.slime-tmp"))  # each written whole, then renamed
        proc.stdin.write(b"anything the raylet sends is read and ignored\n")
        proc.stdin.flush()
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)  # alive while the pipe is open
        proc.stdin.close()  # the raylet is gone
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def _fake_agent(tmp_path: Path) -> Path:
    agent = tmp_path / "agent.py"
    agent.write_text("import sys\nprint('rays agent', *sys.argv[1:])\n")
    return agent


def test_a_command_line_it_does_not_know_runs_rays_agent_instead(tmp_path):
    agent = _fake_agent(tmp_path)
    proc = _start([PORT_NAMES_FLAG + ",".join(NAMES), str(agent), "--node-id=x", "--something-new=1"])
    out, _ = proc.communicate(timeout=60)
    assert out.decode().split() == ["rays", "agent", "--node-id=x", "--something-new=1"]


def test_without_the_raylets_pipe_on_stdin_it_runs_rays_agent_instead(tmp_path):
    agent = _fake_agent(tmp_path)
    argv = [PORT_NAMES_FLAG + ",".join(NAMES), str(agent), "--node-id=x", f"--session-dir={tmp_path}"]
    proc = _start(argv, stdin=subprocess.DEVNULL)
    out, _ = proc.communicate(timeout=60)
    assert out.decode().split()[:2] == ["rays", "agent"]
    assert not list(tmp_path.glob("*_port_*"))  # Ray's agent writes its own
