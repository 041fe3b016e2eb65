"""A port picked free can be taken by another process before the server meant for it binds it (two test
workers, two runs on one node). An engine is ready only once its own process holds its port, and picks another
where slime picked it; the in-process test servers and the trainer's rendezvous store bind theirs when they are made."""

from __future__ import annotations

import socket
import sys
import textwrap

import pytest

from slime.fleet.engine_server import EngineServer, EngineStartError
from slime.testing.port_squatter import squatting
from slime.testing.threaded_server import ThreadedServer
from slime.utils.child_process import listens_on
from slime.utils.misc import find_free_port


def serving_health(port: int) -> list[str]:
    """A command that serves `GET /health` on its `--port` (and exits with an error where it cannot bind it)."""
    code = textwrap.dedent("""
        import http.server, sys
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
        port = int(sys.argv[sys.argv.index("--port") + 1])
        http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
    """)
    return [sys.executable, "-c", code, "--port", str(port)]


@pytest.fixture
def squatted_port():
    """A port another server holds, answering `GET /health` with 200 (as another test's engine would)."""
    with squatting(find_free_port()) as port:
        yield port


def test_an_engine_on_a_port_another_server_took_is_not_ready_on_that_servers_answer(squatted_port, tmp_path):
    """A port the user gave: the engine fails with its own error (the squatter's 200 came at once, before the
    engine had even tried to bind), and is ready as before where the port is its own."""
    engine = EngineServer(serving_health(squatted_port), "127.0.0.1", squatted_port, "given", str(tmp_path))
    with pytest.raises(EngineStartError, match="exited with code 1"):
        engine.start()
    assert "Address already in use" in (tmp_path / "given.log").read_text()
    port = find_free_port()
    engine = EngineServer(serving_health(port), "127.0.0.1", port, "own", str(tmp_path))
    try:
        assert engine.start() == f"http://127.0.0.1:{port}"
    finally:
        engine.stop()


def test_an_engine_whose_picked_port_was_taken_starts_on_another(squatted_port, tmp_path):
    engine = EngineServer(
        serving_health(squatted_port), "127.0.0.1", squatted_port, "picked", str(tmp_path), port_chosen=True
    )
    try:
        url = engine.start()
        assert engine.port != squatted_port and url == f"http://127.0.0.1:{engine.port}"
        assert engine.command[-1] == str(engine.port) and listens_on(engine.pid, engine.port) is True
        assert "Address already in use" in (tmp_path / "picked.log").read_text()
    finally:
        engine.stop()


def test_a_test_server_holds_its_port_from_the_moment_it_is_made():
    server = ThreadedServer(lambda scope, receive, send: None, "127.0.0.1", what="test server")
    with socket.socket() as s, pytest.raises(OSError):
        s.bind(("127.0.0.1", server.port))  # taken before start(): no window for another process
    server.stop()  # never started: its socket is released
    with socket.socket() as s:
        s.bind(("127.0.0.1", server.port))


def test_the_trainers_rendezvous_port_is_served_from_the_moment_rank_0_names_it(tmp_path):
    """`TrainWorker.master_address` binds the gloo group's store on a port the OS picks, then names it (a port
    found free and bound only when the ranks init could be taken in between); rank 1 joins through it."""
    import torch.distributed as dist

    from slime.cli.train import parse_train_args
    from slime.train.flags import WorkerConfig
    from slime.train.worker import TrainWorker

    (tmp_path / "prompts.jsonl").write_text('{"input": "1+1?", "label": "2"}\n')
    args = parse_train_args(["--hf-checkpoint", str(tmp_path), "--prompt-data", str(tmp_path / "prompts.jsonl")])
    worker = TrainWorker(WorkerConfig.from_args(args), args, 2, 0)
    host, port = worker.master_address()
    with socket.socket() as s, pytest.raises(OSError):
        s.bind((host, port))
    joined = dist.TCPStore(host, port, 2, False)  # what rank 1's init does
    joined.set("rank1", "here")
    assert worker._store.get("rank1") == b"here"


def test_an_engine_whose_listener_runs_in_a_child_of_its_command_is_ready(tmp_path):
    """The port check looks at the command's descendants too: a wrapper that runs the server as its child."""
    port = find_free_port()
    wrapper = [sys.executable, "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"]
    engine = EngineServer(
        [*wrapper, *serving_health(port)], "127.0.0.1", port, "wrapped", str(tmp_path), startup_timeout=20
    )
    try:
        assert engine.start() == f"http://127.0.0.1:{port}"
        assert listens_on(engine.pid, port) is True
    finally:
        engine.stop()
