"""Cold start: the per-node fork server (slime.utils.fork_server) and warm engine starts
(slime.engine.warm_start). Children are real processes forked from a real server; engines forked
warm must answer exactly like engines started cold, and take weight updates."""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from slime.engine.warm_start import FORK_SERVER_ENV
from slime.cli.finalize import complete_namespace
from slime.fleet.engine_actor import EngineActor
from slime.fleet.flags import EngineConfig
from slime.ray.flags import SessionConfig
from slime.fleet.engine_server import EngineServer, engine_env, fork_server_launcher
from slime.utils import fork_server
from slime.utils.child_process import ChildProcess, ReadinessError, wait_until
from slime.utils.misc import find_free_port

ROOT = Path(__file__).resolve().parents[1]


# ---- entry points the test fork servers run (resolved by dotted path in the server) ----
def preload_state(tag: str) -> dict:
    return {"tag": tag, "preloaded_in": os.getpid(), "collecting_during_preload": gc.isenabled()}


def child_main(argv: list[str], state: dict) -> None:
    """Prints what it got, then does what argv[0] says."""
    print(
        f"argv={argv} tag={state['tag']} preloaded_in={state['preloaded_in']} pid={os.getpid()} "
        f"env={os.environ.get('COLD_START_TEST')}",
        flush=True,
    )
    if argv[0] == "exit":
        sys.exit(int(argv[1]))
    if argv[0] == "raise":
        raise ValueError("boom in child")
    if argv[0] == "sleep":
        signal.pause()
    if argv[0] == "gc":
        print(
            f"collecting_during_preload={state['collecting_during_preload']} frozen={gc.get_freeze_count()} "
            f"collecting={gc.isenabled()}",
            flush=True,
        )
    if argv[0] == "signals":
        print(f"handlers={signal_handlers()}", flush=True)
    if argv[0] == "write-to-dead-peer":  # what gloo does when a member of its group died
        mine, peer = socket.socketpair()
        peer.close()
        try:
            mine.send(b"chunk")
        except OSError as e:
            print(f"the write raised {type(e).__name__}", flush=True)


def signal_handlers() -> dict[str, str]:
    """This process's handlers of the signals a fork server child must get as a fresh interpreter has them."""
    return {
        s.name: getattr(h, "name", None) or h.__name__
        for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)
        for h in [signal.getsignal(s)]
    }


def _wait_gone(pid: int, timeout: float = 20.0) -> None:
    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie (exited, not yet reaped) is gone for our purposes
            return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
        except OSError:
            return True

    wait_until(gone, timeout, f"pid {pid} gone")


@pytest.fixture()
def server(tmp_path):
    where = Path(tempfile.mkdtemp(prefix="slime-fs-test-"))  # short: a Unix socket path has ~107 bytes
    sock = where / "s.sock"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = ChildProcess(
        [
            sys.executable,
            "-m",
            "slime.utils.fork_server",
            "--socket",
            str(sock),
            "--main",
            "tests.test_cold_start:child_main",
            "--preload",
            "tests.test_cold_start:preload_state",
            "--preload-json",
            '["warm"]',
        ],
        name="test fork server",
        log_path=tmp_path / "server.log",
        env=env,
        ready=lambda: sock.exists(),
        startup_timeout=60,
    ).start()
    yield SimpleNamespace(proc=proc, sock=str(sock), tmp=tmp_path)
    proc.kill()


def _spawn(server, *argv: str, name: str = "child") -> tuple[fork_server.ForkedProcess, Path]:
    log = server.tmp / f"{name}.log"
    child = fork_server.spawn(
        server.sock, list(argv), {"COLD_START_TEST": "yes", "PATH": os.environ["PATH"]}, str(log), timeout=60
    )
    return child, log


def test_child_gets_argv_env_state_and_exit_code(server):
    child, log = _spawn(server, "exit", "3")
    assert child.wait(timeout=60) == 3
    assert child.poll() == 3
    text = log.read_text()
    assert f"argv=['exit', '3'] tag=warm preloaded_in={server.proc.pid} pid={child.pid} env=yes" in text


def test_the_preload_runs_without_collection_and_children_start_with_its_heap_frozen(server):
    """The preload's objects all live on: no collection walks them while it runs, nor later in a child
    (frozen before any fork), and each child collects its own garbage as a fresh interpreter does."""
    child, log = _spawn(server, "gc")
    assert child.wait(timeout=60) == 0
    line = next(x for x in log.read_text().splitlines() if x.startswith("collecting_during_preload="))
    fields = dict(kv.split("=") for kv in line.split())
    assert fields["collecting_during_preload"] == "False"
    assert int(fields["frozen"]) > 10_000  # the server's modules (json, selectors, socket, ...) at least
    assert fields["collecting"] == "True"


def test_child_exception_is_logged_and_exit_code_is_1(server):
    child, log = _spawn(server, "raise")
    assert child.wait(timeout=60) == 1
    assert "ValueError: boom in child" in log.read_text()


def test_a_child_survives_a_write_to_a_dead_peer_as_a_cold_process_does(server):
    """A child handles signals as a fresh interpreter (what a cold start runs): SIGPIPE ignored, so a
    write to a peer that died raises EPIPE. At SIG_DFL the child died of it with nothing in its log:
    an engine whose weight-update group lost a member (gloo writes to peers without MSG_NOSIGNAL)."""
    child, log = _spawn(server, "write-to-dead-peer")
    assert child.wait(timeout=60) == 0
    assert "the write raised BrokenPipeError" in log.read_text()
    child, log = _spawn(server, "signals", name="signals")
    assert child.wait(timeout=60) == 0
    fresh = subprocess.run(
        [sys.executable, "-c", "from tests.test_cold_start import signal_handlers as h; print(h())"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    ).stdout.strip()
    assert "'SIGPIPE': 'SIG_IGN'" in fresh and f"handlers={fresh}" in log.read_text()


def test_children_are_forked_from_the_server_in_their_own_session(server):
    child, _ = _spawn(server, "sleep")
    try:
        assert Path(f"/proc/{child.pid}/stat").read_text().split(")")[1].split()[1] == str(server.proc.pid)  # ppid
        assert os.getpgid(child.pid) == child.pid
        with pytest.raises(Exception) as e:
            child.wait(timeout=0.01)
        assert type(e.value).__name__ == "TimeoutExpired"
        os.killpg(child.pid, signal.SIGTERM)
        assert child.wait(timeout=60) == -signal.SIGTERM
    finally:
        child.close()


def test_closing_the_connection_kills_the_child(server):
    child, _ = _spawn(server, "sleep")
    child.close()  # what the kernel does when the client (an engine actor) dies
    _wait_gone(child.pid)


def test_children_die_with_the_server(server):
    child, _ = _spawn(server, "sleep")
    server.proc.kill()
    assert child.wait(timeout=60) == -signal.SIGKILL
    _wait_gone(child.pid)


def test_bad_log_path_is_refused_with_the_reason(server):
    with pytest.raises(fork_server.ForkServerError, match="cannot open log"):
        fork_server.spawn(server.sock, ["exit", "0"], {}, "/nonexistent-dir/x.log", timeout=30)


def test_unreachable_server_is_an_error_and_the_launcher_falls_back_to_a_cold_start(tmp_path):
    with pytest.raises(fork_server.ForkServerError):
        fork_server.spawn(str(tmp_path / "missing.sock"), ["x"], {}, str(tmp_path / "l.log"), timeout=5)
    launch = fork_server_launcher(str(tmp_path / "missing.sock"))
    child = ChildProcess(
        [sys.executable, "-c", "print('cold')"], name="cold", log_path=tmp_path / "cold.log", launcher=launch
    )
    child.start()
    assert child.wait() == 0
    assert "cold" in (tmp_path / "cold.log").read_text()
    assert fork_server_launcher(None) is None


def test_child_process_supervises_a_forked_child(server):
    """ChildProcess with a launcher: readiness, alive, and the stop escalation work as with Popen."""
    ready = server.tmp / "ready"

    def launch(cp: ChildProcess):
        return fork_server.spawn(server.sock, ["sleep"], {"PATH": os.environ["PATH"]}, str(cp.log_path), timeout=60)

    cp = ChildProcess(
        ["unused"],
        name="forked",
        log_path=server.tmp / "forked.log",
        launcher=launch,
        ready=lambda: ready.touch() or True,
        startup_timeout=30,
    ).start()
    assert cp.alive()
    cp.stop(timeout=30)  # SIGTERM to the group
    assert not cp.alive() and cp.proc.returncode == -signal.SIGTERM

    cp2 = ChildProcess(
        ["unused"],
        name="forked-dies",
        log_path=server.tmp / "dies.log",
        launcher=lambda c: fork_server.spawn(server.sock, ["exit", "7"], {}, str(c.log_path), 60),
        ready=lambda: False,
        startup_timeout=30,
    )
    with pytest.raises(ReadinessError, match="exited with code 7"):
        cp2.start()


def test_no_fork_server_without_embedded_engines_or_when_disabled(monkeypatch):
    from slime.ray.session import start_engine_fork_server

    base = dict(
        rollout_backend="hf",
        hf_checkpoint="/m",
        ray_address=None,
        load_debug_rollout_data=None,
        rollout_num_engines=2,
        log_dir=None,
    )
    for off in ("0", "off", "false", "no", " OFF "):
        monkeypatch.setenv(FORK_SERVER_ENV, off)
        assert start_engine_fork_server(SessionConfig(**base)) is None
    monkeypatch.delenv(FORK_SERVER_ENV)
    for change in (
        {"rollout_backend": "sglang"},
        {"ray_address": "10.0.0.1:6379"},
        {"rollout_num_engines": 0},
        {"load_debug_rollout_data": "x.pt"},
        {"hf_checkpoint": None},
    ):
        assert start_engine_fork_server(SessionConfig(**{**base, **change})) is None
    assert FORK_SERVER_ENV not in os.environ


def test_session_stops_the_fork_server_and_removes_its_directory(tmp_path, monkeypatch):
    """The fork server goes with the Ray session (not at interpreter exit), children included, and
    its socket is never put in the environment (it is passed to the engines as an argument)."""
    from slime.ray.session import RaySession, _await_socket, start_engine_fork_server

    monkeypatch.delenv(FORK_SERVER_ENV, raising=False)
    config = SessionConfig(
        rollout_backend="hf",
        hf_checkpoint=str(tmp_path / "no-model"),
        ray_address=None,
        load_debug_rollout_data=None,
        rollout_num_engines=1,
        log_dir=str(tmp_path),
    )
    fs = start_engine_fork_server(config)
    session = RaySession(False, fs)
    try:
        assert _await_socket(fs) is True  # bound (it may still be preloading: stopped in the middle of it)
        assert FORK_SERVER_ENV not in os.environ
        assert Path(fs.socket_path).parent == Path(fs.where)
        pid, where = fs.pid, fs.where
    finally:
        session.stop()
    assert session.fork_server is None
    assert fs.proc.returncode is not None
    _wait_gone(pid)
    assert not Path(where).exists()
    session.stop()  # twice is fine


# ---- warm engines ----
def _engine(model_dir: Path, launcher, log_dir: Path) -> EngineServer:
    port = find_free_port()
    cmd = [
        sys.executable,
        "-m",
        "slime.engine.hf_server",
        "--model-path",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "info",
    ]
    return EngineServer(cmd, "127.0.0.1", port, f"warm-{port}", str(log_dir), engine_env(), 120.0, launcher=launcher)


def _generate(url: str) -> dict:
    body = {
        "input_ids": [1, 2, 3, 4],
        "sampling_params": {"max_new_tokens": 6, "temperature": 0},
        "return_logprob": True,
    }
    r = requests.post(f"{url}/generate", json=body, timeout=60)
    r.raise_for_status()
    return r.json()


def test_warm_engines_answer_like_a_cold_one_and_take_weight_updates(
    tiny_model_dir, tiny_model_b_dir, tmp_path, monkeypatch
):
    from slime.ray.session import _await_socket, start_engine_fork_server

    monkeypatch.delenv(FORK_SERVER_ENV, raising=False)
    config = SessionConfig(
        rollout_backend="hf",
        hf_checkpoint=str(tiny_model_dir),
        ray_address=None,
        load_debug_rollout_data=None,
        rollout_num_engines=2,
        log_dir=str(tmp_path),
    )
    fs = start_engine_fork_server(config)
    try:
        assert _await_socket(fs) is True
        # the socket reaches an engine as an argument: EngineActor(..., fork_server=) -> hf_server -> launcher
        engine_args = SimpleNamespace(
            engine_host="127.0.0.1",
            rollout_backend="hf",
            log_dir=str(tmp_path),
            hf_checkpoint=str(tiny_model_dir),
            engine_max_batch_size=8,
            engine_threads=1,
            engine_startup_timeout=120.0,
        )
        engine = EngineConfig.from_args(complete_namespace(engine_args))
        warm = [EngineActor(engine, rank, fork_server=fs.socket_path).server for rank in range(2)]
        assert EngineActor(engine, 2).server.process.launcher is None  # no fork server: a cold start
        cold = _engine(tiny_model_dir, None, tmp_path)
        for e in (*warm, cold):
            e.start()
        try:
            assert all(isinstance(e.process.proc, fork_server.ForkedProcess) for e in warm)
            for e in warm:  # ps shows the command the engine stands for, not the fork server's
                assert (
                    Path(f"/proc/{e.pid}/cmdline").read_bytes().replace(b"\0", b" ").strip()
                    == " ".join(e.command).encode()
                )
            assert all(
                "warm start: model and tokenizers preloaded" in (tmp_path / f"{e.name}.log").read_text() for e in warm
            )
            expected = _generate(cold.url)
            for e in warm:
                got = _generate(e.url)
                assert got["output_ids"] == expected["output_ids"]
                assert got["meta_info"]["output_token_logprobs"] == expected["meta_info"]["output_token_logprobs"]
            # a weight update changes the engine that got it, and only that one (copy-on-write)
            other = tiny_model_b_dir
            e0, e1 = warm
            answer = e0.call("POST", "/update_weights_from_disk", {"model_path": str(other), "weight_version": "v2"})
            assert answer["success"] is True
            updated = _generate(e0.url)
            assert updated["meta_info"]["weight_version"] == "v2"
            assert updated["meta_info"]["output_token_logprobs"] != expected["meta_info"]["output_token_logprobs"]
            assert (
                _generate(e1.url)["meta_info"]["output_token_logprobs"]
                == expected["meta_info"]["output_token_logprobs"]
            )
            pid = e1.pid
            e1.kill()
            assert e1.process.proc.returncode == -signal.SIGKILL
            _wait_gone(pid)
        finally:
            for e in (*warm, cold):
                e.stop()
    finally:
        fs.stop(timeout=10)


def test_startup_trace_is_opt_in(tmp_path, monkeypatch):
    from slime.utils import startup_trace

    path = tmp_path / "trace.jsonl"
    monkeypatch.delenv(startup_trace.TRACE_ENV, raising=False)
    startup_trace.mark("not recorded")
    assert not path.exists()
    monkeypatch.setenv(startup_trace.TRACE_ENV, str(path))
    before = time.time()
    startup_trace.mark("ray_init: begin")
    startup_trace.mark("engine: model loaded")
    events = startup_trace.read(str(path))
    assert [e["event"] for e in events] == ["ray_init: begin", "engine: model loaded"]
    assert all(e["pid"] == os.getpid() and e["t"] >= before for e in events)


# ---- issue 20 item 8: no thread imports Ray while another asks whether Ray runs ----
STALLED_RAY_IMPORT = r"""
import importlib.abc, importlib.machinery, sys, threading

started, go = threading.Event(), threading.Event()


class StallRay(importlib.abc.MetaPathFinder):
    '''Stops the import of `ray` once the module is in sys.modules and before it has any name: the
    window a thread importing slime.ray.rollout_manager opens, held open until `go`.'''

    def find_spec(self, name, path, target=None):
        if name != "ray":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        real = spec.loader.exec_module

        def exec_module(module):
            started.set()
            go.wait()
            real(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, StallRay())
from slime.ray.session import ray_running

importer = threading.Thread(target=__import__, args=("ray",))
importer.start()
started.wait()
assert not hasattr(sys.modules["ray"], "is_initialized")  # the half-made module is there
answer = {}


def ask():
    def release(frame, event, arg):  # the question went through the import system: let the import end
        if event == "call" and frame.f_code.co_name in ("_find_and_load", "_lock_unlock_module"):
            go.set()

    sys.setprofile(release)
    try:
        answer["running"] = ray_running()
    except Exception as exc:
        answer["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        sys.setprofile(None)


asker = threading.Thread(target=ask)
asker.start()
asker.join()
go.set()
importer.join()
print(answer)
"""


def test_asking_whether_ray_runs_waits_for_an_import_in_progress(tmp_path):
    """The 5-in-17 start-up failure, reproduced every time: `ray` half-imported by another thread
    while `ray_running()` asks. Reading sys.modules raised `AttributeError: partially initialized module
    'ray' has no attribute 'is_initialized'`; the import system makes the question wait for the import."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", STALLED_RAY_IMPORT],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{'running': False}", out.stdout + out.stderr


def test_ray_init_imports_the_manager_module_after_its_check(ray_cluster, monkeypatch):
    """`import_meanwhile` starts only after ray_init asked whether Ray runs (here it does: the module
    is imported at once, and nothing of Ray is started or stopped by the session)."""
    from slime.ray import session as session_mod

    asked: list[str] = []
    real = session_mod.ray_running
    monkeypatch.setattr(session_mod, "ray_running", lambda: asked.append("asked") or real())
    real_import = session_mod._import_in_thread
    monkeypatch.setattr(
        session_mod, "_import_in_thread", lambda name, **kw: asked.append(f"import {name}") or real_import(name, **kw)
    )
    session = session_mod.ray_init(SimpleNamespace(), import_meanwhile="slime.ray.rollout_manager")
    assert asked == ["asked", "import slime.ray.rollout_manager"]
    assert session.imported().RolloutManager.__name__ == "RolloutManager"
    assert not session.started and session.fork_server is None
