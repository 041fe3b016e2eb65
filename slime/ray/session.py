"""Ray and the rollout manager, started and stopped the same way by every command (`slime-rollout`,
`slime-train`): join `--ray-address` or start a private local Ray whose workers see this checkout,
create the `RolloutManager` actor, and stop it (then Ray, if we started it) whatever happened.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

logger = logging.getLogger("slime")

_FORWARDED_ENV = ("HF_HUB_OFFLINE", "HF_ENDPOINT", "WANDB_MODE", "WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR",
                  "WANDB_CONFIG_DIR", "SLIME_CACHE", "RAY_AUTH_MODE", "TOKENIZERS_PARALLELISM")


def ray_init(args: Any) -> bool:
    """Join `--ray-address`, or start a private local Ray; returns True when we started it."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return False
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
    return True


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
