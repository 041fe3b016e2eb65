"""Start the embedded CPU engine (slime.engine.hf_server) as a real subprocess for tests,
through the same `EngineServer` lifecycle the engine actors use (free port, readiness probed with
a deadline, log tail on failure, process-group shutdown).

Usage: `with run_engine(model_dir) as url: ...`; `fork_server=` (an engine fork server's socket, the
`engine_fork_server` fixture) starts it warm.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from slime.fleet.engine_server import EngineServer, engine_env, fork_server_launcher
from slime.utils.misc import find_free_port


@contextlib.contextmanager
def run_engine(model_dir: str | Path, *extra_args: str, startup_timeout: float = 120.0, fork_server: str | None = None):
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
        "warning",
        *extra_args,
    ]
    server = EngineServer(
        cmd,
        "127.0.0.1",
        port,
        f"test-engine-{port}",
        env=engine_env(),
        startup_timeout=startup_timeout,
        launcher=fork_server_launcher(fork_server),
    )
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
