"""Start the embedded CPU engine (slime.backends.hf_server) as a real subprocess for tests.

Usage: `with run_engine(model_dir) as url: ...` — the server is up (GET /health == 200) when the
block starts and is terminated when it ends. Readiness is probed with a deadline, not a sleep.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@contextlib.contextmanager
def run_engine(model_dir: str | Path, *extra_args: str, startup_timeout: float = 120.0):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile("w+", prefix="hf-engine-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "slime.backends.hf_server", "--model-path", str(model_dir),
           "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", *extra_args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=engine_env(), cwd=str(ROOT))
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"engine exited with {proc.returncode}:\n{Path(log.name).read_text()[-4000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                tail = Path(log.name).read_text()[-4000:]
                raise TimeoutError(f"engine not healthy after {startup_timeout}s:\n{tail}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        os.unlink(log.name)
