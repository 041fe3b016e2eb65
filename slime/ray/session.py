"""Ray and the rollout manager, started and stopped the same way by every command (`slime-rollout`,
`slime-train`): join `--ray-address` or start a private local Ray whose workers see this checkout,
create the `RolloutManager` actor, and stop it (then Ray, if we started it) whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

from slime.utils.startup_trace import mark

logger = logging.getLogger("slime")

_FORWARDED_ENV = ("HF_HUB_OFFLINE", "HF_ENDPOINT", "WANDB_MODE", "WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR",
                  "WANDB_CONFIG_DIR", "SLIME_CACHE", "RAY_AUTH_MODE", "TOKENIZERS_PARALLELISM")


def start_engine_fork_server(args: Any) -> Any:
    """Cold start: with embedded engines on this node (a private Ray), start the node's engine fork
    server now, so torch, transformers and the checkpoint load while Ray and the manager come up,
    once for all engines (slime.engine.warm_start). Its socket path goes into the environment the
    Ray workers inherit. The server dies with this process (`PR_SET_PDEATHSIG`); set
    SLIME_ENGINE_FORK_SERVER=0 to start every engine cold. Returns its `ChildProcess`, or None."""
    import atexit
    import shutil
    import sys

    from slime.engine.warm_start import FORK_SERVER_ENV
    from slime.utils.child_process import ChildProcess

    if os.environ.get(FORK_SERVER_ENV, "").lower() in ("0", "off", "false", "no"):
        return None
    if (getattr(args, "rollout_backend", None) != "hf" or not getattr(args, "hf_checkpoint", None)
            or getattr(args, "ray_address", None) or getattr(args, "load_debug_rollout_data", None)
            or int(getattr(args, "rollout_num_engines", 0) or 0) < 1):
        return None
    where = Path(tempfile.mkdtemp(prefix="slime-fork-"))  # 0700: only this user may ask for a child
    sock = where / "engines.sock"
    log_dir = Path(getattr(args, "log_dir", None) or where)
    cmd = [sys.executable, "-m", "slime.utils.fork_server", "--socket", str(sock),
           "--main", "slime.engine.warm_start:serve", "--preload", "slime.engine.warm_start:preload",
           "--preload-json", json.dumps([str(args.hf_checkpoint)])]
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), "TOKENIZERS_PARALLELISM": "false"}
    server = ChildProcess(cmd, name="engine fork server", log_path=log_dir / "engine-fork-server.log", env=env)
    server.start()  # not awaited: it binds its socket at once, then preloads while clients queue
    server.socket_path = str(sock)
    os.environ[FORK_SERVER_ENV] = str(sock)

    def stop() -> None:
        server.stop(timeout=5)
        shutil.rmtree(where, ignore_errors=True)

    atexit.register(stop)
    return server


def ray_init(args: Any) -> bool:
    """Join `--ray-address`, or start a private local Ray; returns True when we started it."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return False
    mark("ray_init: begin")
    fork_server = start_engine_fork_server(args)
    root = str(Path(__file__).resolve().parents[2])  # the checkout holding the `slime` package
    env = {k: os.environ[k] for k in _FORWARDED_ENV if k in os.environ}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    if args.ray_address:
        ray.init(address=args.ray_address, runtime_env={"env_vars": env}, log_to_driver=True)
        return False
    tmp = Path(tempfile.gettempdir()) / f"slime-ray-{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    # A private Ray's processes inherit our environment: no runtime env, so the workers Ray prestarts
    # serve our actors at once instead of new ones being started for a runtime env (cold start)
    os.environ.update(env)
    ray.init(include_dashboard=False, _temp_dir=str(tmp), log_to_driver=True, configure_logging=True,
             logging_level=logging.WARNING)
    mark("ray_init: ray.init done")
    if fork_server is not None:
        _await_socket(fork_server)
    return True


def _await_socket(server: Any, timeout: float = 30.0) -> None:
    """The fork server's socket exists (it binds before preloading: milliseconds after its start, and
    Ray took seconds), so engines never miss it; if it is not there, they start cold."""
    from slime.engine.warm_start import FORK_SERVER_ENV
    from slime.utils.child_process import ReadinessError, wait_until

    try:
        wait_until(lambda: os.path.exists(server.socket_path), timeout, server.name, server.proc, server.log_path)
    except ReadinessError as e:
        logger.warning("engines will start cold: %s", e)
        os.environ.pop(FORK_SERVER_ENV, None)


def start_manager(args: Any, manager_cls: Any = None) -> tuple[Any, dict[str, Any]]:
    """A started `RolloutManager` actor and its `info()`. If `start` fails, the actor is stopped."""
    import ray

    if manager_cls is None:
        from slime.ray.rollout_manager import RolloutManager as manager_cls
    manager = ray.remote(manager_cls).options(num_cpus=0, max_concurrency=8).remote(args)
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
    try:
        ray.get(manager.shutdown.remote(), timeout=timeout)
    except Exception as e:  # noqa: BLE001 - shutting down after another error
        logger.warning("manager shutdown: %s", e)
    with contextlib.suppress(Exception):
        ray.kill(manager)


@contextlib.contextmanager
def ray_session(args: Any) -> Iterator[bool]:
    """Ray for the duration of the block; shut down at the end only if this block started it."""
    import ray

    started = ray_init(args)
    try:
        yield started
    finally:
        if started:
            ray.shutdown()


def format_startup(info: dict[str, Any]) -> str | None:
    if not info.get("router_url"):
        return None
    ready = ", ".join(f"{k} {v:.1f}s" for k, v in info["startup_seconds"].items())
    return (f"router {info['router_url']} with {len(info['engine_urls'])} engine(s): "
            f"{', '.join(info['engine_urls'])} (ready after: {ready})")
