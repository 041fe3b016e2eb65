"""Ray and the rollout manager, started and stopped the same way by every command (`slime-rollout`,
`slime-train`): join `--ray-address` or start a private local Ray whose workers import the user's code first and
this checkout last (`worker_path`),
create the `RolloutManager` actor, and stop it (then Ray, if we started it) whatever happened.
With a private Ray and embedded engines, the session also runs the node's engine fork server (warm
engine starts); it is stopped with the session.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sys
import tempfile
import threading
from concurrent.futures import Future
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

from slime.ray.flags import SessionConfig
from slime.ray.keep_sigterm import keep_sigterm_handler
from slime.ray.lean_head import lean_head
from slime.ray.process_keeper import RayProcessKeeper
from slime.ray.stale_dirs import remove_stale_run_dirs
from slime.utils.startup_trace import mark

logger = logging.getLogger("slime")

_FORWARDED_ENV = (
    "HF_HUB_OFFLINE",
    "HF_ENDPOINT",
    "WANDB_MODE",
    "WANDB_DIR",
    "WANDB_CACHE_DIR",
    "WANDB_DATA_DIR",
    "WANDB_CONFIG_DIR",
    "SLIME_CACHE",
    "RAY_AUTH_MODE",
    "TOKENIZERS_PARALLELISM",
)


class RaySession:
    """What `ray_init` started, stopped by `stop()`: Ray itself (only if we started it) and the node's
    engine fork server. The fork server goes with the session, not at interpreter exit, so a command's
    check for leftover processes finds nothing."""

    def __init__(self, started: bool, fork_server: Any = None):
        self.started, self.fork_server = started, fork_server
        self.fork_server_socket: str | None = None  # handed to the manager (start_manager), once it listens
        self._imported: Future | None = None  # the module `ray_init(import_meanwhile=...)` imports
        self.ray_tmp: Path | None = None  # the private Ray's temp dir (/tmp/slime-ray-<pid>), removed by stop()
        self.ray_keeper: RayProcessKeeper | None = None  # takes down what of a private Ray stop() left (process_keeper)

    def imported(self) -> ModuleType:
        """The module `ray_init` was asked to import while Ray started (its import error, if any)."""
        if self._imported is None:
            raise RuntimeError("ray_init was not asked to import a module (import_meanwhile)")
        return self._imported.result()

    def stop(self) -> None:
        """Ray (if ours), the fork server, what is left of Ray's processes, Ray's temp dir: each step
        runs whatever the ones before raised."""
        with contextlib.ExitStack() as steps:
            steps.callback(mark, "exit: ray's temp dir removed")
            steps.callback(self._remove_ray_tmp)
            steps.callback(mark, "exit: ray's processes taken down")
            steps.callback(self._take_down_ray_sessions)
            steps.callback(mark, "exit: fork server stopped")
            steps.callback(self.stop_fork_server)
            # asked first, waited for after Ray's stop: its engines are gone, and the end of a process holding
            # torch and a checkpoint takes a few tenths of a second, spent here while Ray stops
            self._ask_fork_server_to_stop()
            if self.started:
                import ray

                ray.shutdown()
                mark("exit: ray.shutdown done")

    def _take_down_ray_sessions(self) -> None:
        """What of a private Ray's processes `ray.shutdown()` left (agents, workers) is killed (process_keeper)."""
        keeper, self.ray_keeper = self.ray_keeper, None
        if keeper is not None:
            keeper.stop()

    def _remove_ray_tmp(self) -> None:
        """Sockets, session logs: every run left one behind."""
        tmp, self.ray_tmp = self.ray_tmp, None
        if tmp is not None:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)

    def _ask_fork_server_to_stop(self) -> None:
        if self.fork_server is not None:
            self.fork_server.ask_to_stop()

    def stop_fork_server(self) -> None:
        """Stop the fork server (its engines are children: they go with it) and remove its directory."""
        import shutil

        server, self.fork_server, self.fork_server_socket = self.fork_server, None, None
        if server is not None:
            try:
                server.stop(timeout=5)
            finally:
                shutil.rmtree(server.where, ignore_errors=True)


# `ray.shutdown()` imports Ray's compiled-graph modules to find compiled graphs to tear down (none here):
# 0.25 s of the driver's exit. Imported on a thread while the driver waits for the manager's stop instead,
# and that import is over when `stop_manager` returns: a thread still importing (creating loggers) beside
# whatever the process runs next is a race (pytest's logging plugin walks `loggerDict` without its lock).
_RAY_SHUTDOWN_IMPORTS = "ray.dag.compiled_dag_node"
_IMPORT_WAIT = 30.0  # seconds `stop_manager` waits at most for that import (normally done long before)


def fork_server_disabled() -> bool:
    """`SLIME_ENGINE_FORK_SERVER=0` (a tuning knob read here only): every engine starts cold."""
    from slime.engine.warm_start import FORK_SERVER_ENV

    return os.environ.get(FORK_SERVER_ENV, "").strip().lower() in ("0", "off", "false", "no")


def start_engine_fork_server(config: SessionConfig) -> Any:
    """Cold start: with embedded engines on this node (a private Ray), start the node's engine fork
    server now, so torch, transformers and the checkpoint load while Ray and the manager come up,
    once for all engines (slime.engine.warm_start). Not awaited: it binds its socket at once, then
    preloads while clients queue. The server dies with this process (`PR_SET_PDEATHSIG`); the
    session stops it. Returns its `ChildProcess` (`socket_path`, `where`: its private directory),
    or None."""
    from slime.utils.child_process import ChildProcess

    if fork_server_disabled():
        return None
    if (
        config.rollout_backend != "hf"
        or not config.hf_checkpoint
        or config.ray_address
        or config.load_debug_rollout_data
        or int(config.rollout_num_engines or 0) < 1
    ):
        return None
    where = Path(tempfile.mkdtemp(prefix=f"slime-fork-{os.getpid()}-"))  # 0700: only this user may ask for a child
    sock = where / "engines.sock"
    log_dir = Path(config.log_dir or where)
    cmd = [
        sys.executable,
        "-m",
        "slime.utils.fork_server",
        "--socket",
        str(sock),
        "--main",
        "slime.engine.warm_start:serve",
        "--preload",
        "slime.engine.warm_start:preload",
        "--preload-json",
        json.dumps([str(config.hf_checkpoint)]),
    ]
    root = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    server = ChildProcess(cmd, name="engine fork server", log_path=log_dir / "engine-fork-server.log", env=env)
    try:
        server.start()
    except BaseException:
        import shutil

        shutil.rmtree(where, ignore_errors=True)
        raise
    server.socket_path, server.where = str(sock), str(where)
    return server


def ray_running() -> bool:
    """Whether this process has already joined Ray. Never reads a half-imported module: when Ray is
    being imported by another thread, `import ray` waits for that import to finish (the import
    system's per-module lock), where `sys.modules["ray"]` would be a module without its names yet."""
    if "ray" not in sys.modules:  # never imported: cannot be initialised (and importing it costs ~0.5 s)
        return False
    import ray

    return ray.is_initialized()


def ray_init(args: Any, *, import_meanwhile: str | None = None) -> RaySession:
    """Join `--ray-address`, or start a private local Ray (and, for embedded engines, the node's
    engine fork server, whose socket is the session's `fork_server_socket`, for `start_manager`). The
    caller stops what was started with the returned session's `stop()`.

    `import_meanwhile` (cold start): a module imported on a thread while Ray starts, handed out by
    `session.imported()`. The thread starts only after this function has asked whether Ray already
    runs and has started the fork server: nothing imports Ray concurrently with that question.
    The namespace is read once here (`SessionConfig`; one built by hand is completed with the parser's
    defaults first)."""
    from slime.utils.plugin_args import completed

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray_running():
        session = RaySession(False)
        session._imported = _import_in_thread(import_meanwhile, wait=True)
        return session
    mark("ray_init: begin")
    remove_stale_run_dirs()  # of runs SIGKILLed before their stop could remove them
    config = SessionConfig.from_args(completed(args))
    # first, before importing Ray (~0.5 s): the fork server's preload is the longest part of a start
    fork_server = start_engine_fork_server(config)
    session = RaySession(False, fork_server)
    try:
        session._imported = _import_in_thread(import_meanwhile)
        _start_ray(config.ray_address, session)
        if fork_server is not None:
            if _await_socket(fork_server):
                session.fork_server_socket = fork_server.socket_path
            else:
                session.stop_fork_server()
    except BaseException:
        session.stop()
        raise
    return session


def _import_in_thread(name: str | None, *, wait: bool = False) -> Future | None:
    """`importlib.import_module(name)` on a daemon thread (or here, with `wait`); its future."""
    if name is None:
        return None
    fut: Future = Future()

    def run() -> None:
        try:
            fut.set_result(importlib.import_module(name))
        except BaseException as exc:  # noqa: BLE001 - handed to `imported()`
            fut.set_exception(exc)

    if wait:
        run()
    else:
        threading.Thread(target=run, name=f"import-{name}", daemon=True).start()
    return fut


def _start_ray(ray_address: str | None, session: RaySession) -> None:
    import ray

    from slime.ray.worker_path import worker_pythonpath

    env = {k: os.environ[k] for k in _FORWARDED_ENV if k in os.environ}
    env["PYTHONPATH"] = worker_pythonpath()  # the user's code first, our checkout last (worker_path)
    if ray_address:
        with keep_sigterm_handler():  # a SIGTERM during the start is held, then takes the orderly stop
            ray.init(address=ray_address, runtime_env={"env_vars": env}, log_to_driver=True)
        return
    tmp = Path(tempfile.gettempdir()) / f"slime-ray-{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    session.ray_tmp = tmp
    # A private Ray's processes inherit our environment: no runtime env, so the workers Ray prestarts
    # serve our actors at once instead of new ones being started for a runtime env (cold start)
    os.environ.update(env)
    # Ray's processes in sessions of their own: a SIGTERM to the command's group is the command's alone
    session.ray_keeper = RayProcessKeeper.start()
    keeper = session.ray_keeper.inside() if session.ray_keeper else contextlib.nullcontext()
    with keep_sigterm_handler(), keeper, lean_head():  # no autoscaler monitor, no dashboard API server
        ray.init(
            include_dashboard=False,
            _temp_dir=str(tmp),
            log_to_driver=True,
            configure_logging=True,
            logging_level=logging.WARNING,
        )
        session.started = True  # before a held SIGTERM is raised: the stop then shuts this Ray down
    mark("ray_init: ray.init done")


def _await_socket(server: Any, timeout: float = 30.0) -> bool:
    """The fork server's socket exists (it binds before preloading: milliseconds after its start, and
    Ray took seconds), so engines never miss it; if it is not there, they start cold (False)."""
    from slime.utils.child_process import ReadinessError, wait_until

    try:
        wait_until(lambda: os.path.exists(server.socket_path), timeout, server.name, server.proc, server.log_path)
        return True
    except ReadinessError as e:
        logger.warning("engines will start cold: %s", e)
        return False


def start_manager(args: Any, manager_cls: Any = None, *, fork_server: str | None = None) -> tuple[Any, dict[str, Any]]:
    """A started `RolloutManager` actor and its `info()`; `fork_server` is the session's engine fork
    server socket (warm engine starts), or None. If `start` fails, the actor is stopped."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if manager_cls is None:
        from slime.ray.rollout_manager import RolloutManager as manager_cls
    # on this command's node (a cluster's head): the router, its child, lives there too, reachable on
    # 127.0.0.1, and no worker node's loss takes the manager or the router with it
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    manager = (
        ray.remote(manager_cls)
        .options(num_cpus=0, max_concurrency=8, scheduling_strategy=here)
        .remote(args, fork_server=fork_server)
    )
    try:
        info = ray.get(manager.start.remote())
    except BaseException:
        stop_manager(manager)
        raise
    return manager, info


def stop_manager(manager: Any, timeout: float = 120.0) -> None:
    """`shutdown()` the manager (router, engines, tools, wandb), then kill its actor."""
    import ray

    if manager is None:
        return
    imported = _import_in_thread(_RAY_SHUTDOWN_IMPORTS)
    try:
        ray.get(manager.shutdown.remote(), timeout=timeout)
    except Exception as e:  # noqa: BLE001 - shutting down after another error
        logger.warning("manager shutdown: %s", e)
    with contextlib.suppress(Exception):
        ray.kill(manager)
    with contextlib.suppress(Exception):  # (another Ray without the module: nothing to wait for)
        imported.result(timeout=_IMPORT_WAIT)


@contextlib.contextmanager
def ray_session(args: Any) -> Iterator[RaySession]:
    """Ray (and the engine fork server) for the duration of the block; Ray is shut down at the end only
    if this block started it."""
    session = ray_init(args)
    try:
        yield session
    finally:
        session.stop()


def format_startup(info: dict[str, Any]) -> str | None:
    if not info.get("router_url"):
        return None
    ready = ", ".join(f"{k} {v:.1f}s" for k, v in info["startup_seconds"].items())
    return (
        f"router {info['router_url']} with {len(info['engine_urls'])} engine(s): "
        f"{', '.join(info['engine_urls'])} (ready after: {ready})"
    )
