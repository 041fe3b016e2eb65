"""One inference server process and its lifecycle, shared by both backends.

Embedded (`hf`) and SGLang servers differ only in the command that starts them. Everything
else is the same: a free port, a log file, readiness probed with a deadline (never a fixed
sleep), an error carrying the log's tail when start-up fails (with the process group killed so
nothing is left running), control calls over SGLang's HTTP API, clean shutdown.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import requests

from slime.utils.child_process import ChildProcess, ReadinessError, http_ok
from slime.utils.misc import find_free_port


class EngineStartError(RuntimeError):
    pass


def sglang_server_args(args: Any, *, host: str, port: int, base_gpu_id: int, tp_size: int,
                       nnodes: int = 1, node_rank: int = 0, dist_init_addr: str | None = None) -> list[str]:
    """Arguments for `python -m sglang.launch_server` (SGLang's documented CLI)."""
    cmd = ["--model-path", str(args.hf_checkpoint), "--host", host, "--port", str(port),
           "--tp-size", str(tp_size), "--base-gpu-id", str(base_gpu_id), "--skip-server-warmup",
           "--trust-remote-code"]
    if nnodes > 1:
        cmd += ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--dist-init-addr", str(dist_init_addr)]
    if getattr(args, "sglang_mem_fraction_static", None) is not None:
        cmd += ["--mem-fraction-static", str(args.sglang_mem_fraction_static)]
    if getattr(args, "offload", False):
        cmd += ["--enable-memory-saver"]
    if getattr(args, "rollout_seed", None) is not None:
        cmd += ["--random-seed", str(args.rollout_seed)]
    for name, value in sorted((getattr(args, "sglang_extra_args", None) or {}).items()):
        flag = "--" + name.replace("_", "-")
        cmd += [flag] if value is True else [flag, str(value)]
    return cmd


def base_gpu_id(args: Any, rank: int) -> int:
    """First GPU of engine `rank` on its node (engines are packed node by node)."""
    per_engine_on_node = min(args.num_gpus_per_node, args.rollout_num_gpus_per_engine)
    return (rank * per_engine_on_node) % args.num_gpus_per_node


class EngineServer:
    """A server process speaking SGLang's HTTP API, supervised by `ChildProcess`."""

    def __init__(self, command: list[str], host: str, port: int, name: str, log_dir: str | None = None,
                 env: dict[str, str] | None = None, startup_timeout: float = 300.0):
        self.host, self.port, self.name = host, port, name
        log_path = Path(log_dir or tempfile.mkdtemp(prefix="slime-engine-")) / f"{name}.log"
        self.process = ChildProcess(command, name=f"engine {name} at {self.url}", log_path=log_path, env=env,
                                    ready=http_ok(f"{self.url}/health"), startup_timeout=startup_timeout)

    @property
    def command(self) -> list[str]:
        return self.process.command

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def start(self) -> str:
        try:
            self.process.start()
        except ReadinessError as e:
            raise EngineStartError(str(e)) from None
        return self.url

    def alive(self) -> bool:
        return self.process.alive()

    def kill(self) -> None:
        self.process.kill()

    def stop(self, timeout: float = 15.0) -> None:
        self.process.stop(timeout)

    def call(self, method: str, path: str, payload: dict | None = None, timeout: float = 120.0) -> Any:
        r = requests.request(method, f"{self.url}{path}", json=payload, timeout=timeout)
        r.raise_for_status()
        try:
            return r.json()
        except ValueError:
            return r.text

    def log_tail(self) -> str:
        return self.process.log_tail()


def engine_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def hf_server(args: Any, rank: int, host: str, log_dir: str | None) -> EngineServer:
    port = find_free_port(host)
    cmd = [sys.executable, "-m", "slime.engine.hf_server", "--model-path", str(args.hf_checkpoint),
           "--host", host, "--port", str(port), "--max-batch-size", str(args.engine_max_batch_size)]
    if args.engine_threads:
        cmd += ["--num-threads", str(args.engine_threads)]
    return EngineServer(cmd, host, port, f"engine-hf-{rank}", log_dir, engine_env(), args.engine_startup_timeout)


def sglang_server(args: Any, rank: int, host: str, log_dir: str | None, *, node_rank: int = 0, nnodes: int = 1,
                  dist_init_addr: str | None = None) -> EngineServer:
    port = find_free_port(host)
    tp = args.rollout_num_gpus_per_engine
    cmd = [sys.executable, "-m", "sglang.launch_server",
           *sglang_server_args(args, host=host, port=port, base_gpu_id=base_gpu_id(args, rank), tp_size=tp,
                               nnodes=nnodes, node_rank=node_rank, dist_init_addr=dist_init_addr)]
    return EngineServer(cmd, host, port, f"engine-sglang-{rank}-n{node_rank}", log_dir, engine_env(),
                        args.engine_startup_timeout)
