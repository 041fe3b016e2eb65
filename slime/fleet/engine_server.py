"""One inference server process and its lifecycle, shared by both backends.

Embedded (`hf`) and SGLang servers differ only in the command that starts them. Everything
else is the same: a free port, a log file, readiness probed with a deadline (never a fixed
sleep), an error carrying the log's tail when start-up fails (with the process group killed so
nothing is left running), control calls over SGLang's HTTP API, clean shutdown.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import requests

from slime.fleet.flags import EngineConfig
from slime.utils import fork_server
from slime.utils.child_process import ChildProcess, ReadinessError, http_ok, start_picking_ports
from slime.utils.misc import find_free_port


logger = logging.getLogger(__name__)


class EngineStartError(RuntimeError):
    pass


# SGLang flags slime sets itself from its own flags: a `--sglang-<name>` passthrough may not override them
# (the engine would disagree with its placement or its router registration).
MANAGED_SGLANG_FLAGS = {
    "model_path": "--hf-checkpoint",
    "model": "--hf-checkpoint",
    "host": "--engine-host",
    "port": "(a free port)",
    "tp_size": "--rollout-num-gpus-per-engine",
    "tensor_parallel_size": "--rollout-num-gpus-per-engine",
    "base_gpu_id": "(placement)",
    "nnodes": "(placement)",
    "node_rank": "(placement)",
    "dist_init_addr": "(placement)",
    "random_seed": "--rollout-seed",
    "enable_memory_saver": "--offload",
    "mem_fraction_static": "--sglang-mem-fraction-static",
    "pp_size": "--sglang-pp-size",
}


def sglang_server_args(
    config: EngineConfig,
    *,
    host: str,
    port: int,
    base_gpu_id: int,
    tp_size: int,
    nnodes: int = 1,
    node_rank: int = 0,
    dist_init_addr: str | None = None,
) -> list[str]:
    """Arguments for `python -m sglang.launch_server` (checked against SGLang's own parser in
    tests/test_sglang_contract.py). `tp_size` is the engine's GPU count; with `--sglang-pp-size P` the
    engine runs tensor parallel `tp_size // P` times pipeline parallel `P`, as slime does."""
    pp = int(config.sglang_pp_size or 1)
    if pp < 1 or tp_size % pp:
        raise ValueError(
            f"--sglang-pp-size {pp} must divide the engine's {tp_size} GPUs (--rollout-num-gpus-per-engine)"
        )
    cmd = [
        "--model-path",
        str(config.hf_checkpoint),
        "--host",
        host,
        "--port",
        str(port),
        "--tp-size",
        str(tp_size // pp),
        "--base-gpu-id",
        str(base_gpu_id),
        "--skip-server-warmup",
        "--trust-remote-code",
    ]
    if pp > 1:
        cmd += ["--pp-size", str(pp)]
    if nnodes > 1:
        if not dist_init_addr:
            raise ValueError(f"an SGLang engine over {nnodes} nodes needs dist_init_addr (host:port of node 0)")
        cmd += ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--dist-init-addr", str(dist_init_addr)]
    if config.sglang_mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(config.sglang_mem_fraction_static)]
    if config.offload:
        cmd += ["--enable-memory-saver"]
    if config.rollout_seed is not None:
        cmd += ["--random-seed", str(config.rollout_seed)]
    for name, value in sorted(config.sglang_extra_args.items()):
        if name in MANAGED_SGLANG_FLAGS:
            raise ValueError(
                f"--sglang-{name.replace('_', '-')} is set by slime; use {MANAGED_SGLANG_FLAGS[name]} instead"
            )
        flag = "--" + name.replace("_", "-")
        if value is True:
            cmd += [flag]
        elif isinstance(value, (list, tuple)):
            cmd += [flag, *map(str, value)]
        else:
            cmd += [flag, str(value)]
    return cmd


def base_gpu_id(config: EngineConfig, rank: int) -> int:
    """First GPU of engine `rank` on its node (engines are packed node by node)."""
    per_engine_on_node = min(config.num_gpus_per_node, config.rollout_num_gpus_per_engine)
    return (rank * per_engine_on_node) % config.num_gpus_per_node


def fork_server_launcher(socket_path: str | None) -> Callable[[ChildProcess], Any] | None:
    """A `ChildProcess` launcher that forks `python -m slime.engine.hf_server ARGS` warm from the
    node's fork server listening on `socket_path` (see slime.engine.warm_start), or None when there
    is none. If the server cannot be reached the engine starts the ordinary way (a warning, not an
    error)."""
    if not socket_path:
        return None

    def launch(child: ChildProcess) -> Any:
        argv = child.command[3:]  # after `python -m slime.engine.hf_server`
        try:
            return fork_server.spawn(
                socket_path,
                argv,
                dict(child.env or os.environ),
                str(child.log_path),
                timeout=child.startup_timeout,
                title=" ".join(child.command),
            )
        except fork_server.ForkServerError as e:
            logger.warning("%s: %s; starting it cold", child.name, e)
            return None

    return launch


class EngineServer:
    """A server process speaking SGLang's HTTP API, supervised by `ChildProcess`."""

    def __init__(
        self,
        command: list[str],
        host: str,
        port: int,
        name: str,
        log_dir: str | None = None,
        env: dict[str, str] | None = None,
        startup_timeout: float = 300.0,
        launcher: Callable[[ChildProcess], Any] | None = None,
        port_chosen: bool = False,
    ):
        """`port_chosen`: slime picked `port` free (the command's `--port`); if it is taken by the time the
        engine binds it, `start` picks another, as the router's does (a port the user gave is never changed)."""
        self.host, self.port, self.name, self.port_chosen = host, port, name, port_chosen
        self._log_path = Path(log_dir or tempfile.mkdtemp(prefix="slime-engine-")) / f"{name}.log"
        self._env, self._startup_timeout, self._launcher = env, startup_timeout, launcher
        self.process = self._child(command)

    def _child(self, command: list[str]) -> ChildProcess:
        return ChildProcess(
            command,
            name=f"engine {self.name} at {self.url}",
            log_path=self._log_path,
            env=self._env,
            ready=http_ok(f"{self.url}/health"),
            startup_timeout=self._startup_timeout,
            launcher=self._launcher,
            port=self.port,  # another process on the port (it was picked free, then taken) is not this engine
        )

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
            start_picking_ports(lambda: self.process.start(), self._pick_port_again)  # (the process picked again)
        except ReadinessError as e:
            raise EngineStartError(str(e)) from None
        return self.url

    def _pick_port_again(self) -> bool:
        """The port slime picked for the engine was taken before it bound it: another, in its command."""
        if not (self.port_chosen and "--port" in self.command):
            return False
        logger.warning("engine %s: port %d was taken meanwhile; picking another", self.name, self.port)
        self.port = find_free_port(self.host)
        command = list(self.command)
        command[command.index("--port") + 1] = str(self.port)
        self.process = self._child(command)
        return True

    def alive(self) -> bool:
        return self.process.alive()

    def kill(self) -> None:
        self.process.kill()

    def stop(self, timeout: float = 15.0) -> None:
        self.process.stop(timeout)

    def call(
        self,
        method: str,
        path: str,
        payload: dict | None = None,
        timeout: float = 120.0,
        answer_statuses: tuple[int, ...] = (),
    ) -> Any:
        """The JSON (or text) answer. An error status raises `requests.HTTPError` carrying the engine's own
        message (e.g. the tensor a weight push got wrong), unless it is in `answer_statuses`."""
        r = requests.request(method, f"{self.url}{path}", json=payload, timeout=timeout)
        try:
            answer = r.json()
        except ValueError:
            answer = r.text
        if r.status_code >= 400 and r.status_code not in answer_statuses:
            msg = answer
            if isinstance(answer, dict):
                msg = answer.get("message") or (answer.get("error") or {}).get("message") or answer
            raise requests.HTTPError(f"{self.name}: {method} {path} -> HTTP {r.status_code}: {msg}", response=r)
        return answer

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


def hf_server(config: EngineConfig, rank: int, host: str, fork_server: str | None = None) -> EngineServer:
    """The embedded engine; `fork_server`: the socket of this node's engine fork server (a warm start)."""
    port = find_free_port(host)
    cmd = [
        sys.executable,
        "-m",
        "slime.engine.hf_server",
        "--model-path",
        str(config.hf_checkpoint),
        "--host",
        host,
        "--port",
        str(port),
        "--max-batch-size",
        str(config.engine_max_batch_size),
    ]
    if config.engine_threads:
        cmd += ["--num-threads", str(config.engine_threads)]
    return EngineServer(
        cmd,
        host,
        port,
        f"engine-hf-{rank}",
        config.log_dir,
        engine_env(),
        config.engine_startup_timeout,
        launcher=fork_server_launcher(fork_server),
        port_chosen=True,
    )


def sglang_server(
    config: EngineConfig,
    rank: int,
    host: str,
    *,
    node_rank: int = 0,
    nnodes: int = 1,
    dist_init_addr: str | None = None,
) -> EngineServer:
    port = find_free_port(host)
    tp = config.rollout_num_gpus_per_engine
    cmd = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        *sglang_server_args(
            config,
            host=host,
            port=port,
            base_gpu_id=base_gpu_id(config, rank),
            tp_size=tp,
            nnodes=nnodes,
            node_rank=node_rank,
            dist_init_addr=dist_init_addr,
        ),
    ]
    return EngineServer(
        cmd,
        host,
        port,
        f"engine-sglang-{rank}-n{node_rank}",
        config.log_dir,
        engine_env(),
        config.engine_startup_timeout,
        port_chosen=True,
    )
