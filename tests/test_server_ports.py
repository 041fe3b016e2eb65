"""A port picked free can be taken by another process before the server meant for it binds it (two test
workers, two runs on one node). An engine is ready only once its own process holds its port; the in-process
test servers bind theirs when they are made."""

from __future__ import annotations

import http.server
import socket
import sys
import textwrap
import threading

import pytest

from slime.fleet.engine_server import EngineServer, EngineStartError
from slime.testing.threaded_server import ThreadedServer
from slime.utils.misc import find_free_port


class Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def serving_health(port: int) -> list[str]:
    """A command that serves `GET /health` on `port` (and exits with an error where it cannot bind it)."""
    code = textwrap.dedent(f"""
        import http.server
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
        http.server.ThreadingHTTPServer(("127.0.0.1", {port}), H).serve_forever()
    """)
    return [sys.executable, "-c", code]


def test_an_engine_whose_port_another_server_took_is_not_ready_on_that_servers_answer(tmp_path):
    port = find_free_port()
    squatter = http.server.ThreadingHTTPServer(("127.0.0.1", port), Healthy)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    try:
        engine = EngineServer(serving_health(port), "127.0.0.1", port, "squatted", str(tmp_path), startup_timeout=30)
        with pytest.raises(EngineStartError, match="exited with code 1"):
            engine.start()  # the squatter's 200 answered at once; the engine itself never bound the port
        assert "Address already in use" in (tmp_path / "squatted.log").read_text()
    finally:
        squatter.shutdown()
        squatter.server_close()
    engine = EngineServer(serving_health(port), "127.0.0.1", port, "own", str(tmp_path), startup_timeout=30)
    try:
        assert engine.start() == f"http://127.0.0.1:{port}"  # its own port: ready as before
    finally:
        engine.process.stop()


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
