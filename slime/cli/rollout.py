"""`slime-rollout` / `python -m slime`: run evals and rollouts end to end and print a summary.

This is slime's `--debug-rollout-only` path: no trainer, the batches are built (and optionally
saved) exactly as a trainer would receive them. Ctrl-C stops everything that was started.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from slime.cli.args import ArgError, parse_args
from slime.cli.errors import describe

logger = logging.getLogger("slime")


def _ray_init(args: Any) -> bool:
    """Join `--ray-address`, or start a private local Ray; returns True when we started it."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return False
    root = str(Path(__file__).resolve().parents[1])
    env = {k: os.environ[k] for k in ("HF_HUB_OFFLINE", "HF_ENDPOINT", "WANDB_MODE", "WANDB_DIR", "SLIME_CACHE",
                                      "RAY_AUTH_MODE") if k in os.environ}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    if args.ray_address:
        ray.init(address=args.ray_address, runtime_env={"env_vars": env}, log_to_driver=True)
        return False
    tmp = Path(tempfile.gettempdir()) / f"slime-ray-{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    ray.init(include_dashboard=False, _temp_dir=str(tmp), runtime_env={"env_vars": env}, log_to_driver=True,
             configure_logging=True, logging_level=logging.WARNING)
    return True


def _format_summary(s: dict[str, Any]) -> str:
    return (f"rollout {s['rollout_id']}: samples={s['samples']} mean_reward={s['mean_reward']:.4f} "
            f"truncated_ratio={s['truncated_ratio']:.3f} failed={s['failed']} tokens/s={s['tokens_per_s']:.1f} "
            f"time={s['seconds']:.2f}s engine_retries={s['engine_retries']}")


def _wait(ref: Any, manager: Any, description: str) -> Any:
    """Wait for an actor call, showing live progress from the manager's status query."""
    import ray

    from slime.observability.progress import RolloutProgress

    with RolloutProgress(total=0, description=description) as bar:
        while True:
            done, _ = ray.wait([ref], timeout=0.5)
            st = ray.get(manager.status.remote())
            bar.update(total=st.get("target"), done=st.get("done"), in_flight=st.get("in_flight"),
                       tokens=st.get("tokens"), retries=st.get("retries"))
            if done:
                return ray.get(ref)


def run(args: Any) -> list[dict[str, Any]]:
    import ray

    from slime.ray.rollout_manager import RolloutManager
    from slime.utils.misc import load_function

    # Fail on a bad plugin path before anything is started.
    for flag in ("rollout_function_path", "eval_function_path", "custom_generate_function_path", "custom_rm_path",
                 "dynamic_sampling_filter_path"):
        if getattr(args, flag, None):
            load_function(getattr(args, flag), "--" + flag.replace("_", "-"))
    if args.hf_checkpoint is None and args.rollout_backend == "hf":
        from slime.engine.default_model import ensure_default_model

        args.hf_checkpoint = str(ensure_default_model())
    started_ray = _ray_init(args)
    manager = None
    summaries: list[dict[str, Any]] = []
    try:
        manager = ray.remote(RolloutManager).options(num_cpus=0, max_concurrency=8).remote(args)
        info = ray.get(manager.start.remote())
        if info["router_url"]:
            ready = ", ".join(f"{k} {v:.1f}s" for k, v in info["startup_seconds"].items())
            print(f"router {info['router_url']} with {len(info['engine_urls'])} engine(s): "
                  f"{', '.join(info['engine_urls'])} (ready after: {ready})", flush=True)

        def evaluate(rollout_id: int) -> None:
            result = _wait(manager.eval.remote(rollout_id), manager, f"eval {rollout_id}")
            for name, r in result.items():
                print(f"eval {rollout_id} [{name}]: samples={r['samples']} mean_reward={r['mean_reward']:.4f} "
                      f"truncated_ratio={r['truncated_ratio']:.3f}", flush=True)

        if args.eval_datasets and not args.skip_eval_before_train and not args.load_debug_rollout_data:
            evaluate(args.start_rollout_id)
        for rollout_id in range(args.start_rollout_id, args.num_rollout):
            box = _wait(manager.generate.remote(rollout_id), manager, f"rollout {rollout_id}")
            ray.get(box.inner)  # the batch, as a trainer would fetch it
            summary = ray.get(manager.last_summary.remote())
            summaries.append(summary)
            print(_format_summary(summary), flush=True)
            if args.eval_datasets and args.eval_interval and (rollout_id + 1) % args.eval_interval == 0 \
                    and not args.load_debug_rollout_data:
                evaluate(rollout_id + 1)
        if summaries:
            n = sum(s["samples"] for s in summaries)
            mean = sum(s["mean_reward"] * s["samples"] for s in summaries) / max(1, n)
            print(f"done: {len(summaries)} rollout(s), {n} samples, mean_reward={mean:.4f}, "
                  f"{sum(s['seconds'] for s in summaries):.1f}s in rollouts"
                  + "".join(f"; {what} in {where}" for what, where in (
                      ("dumps", getattr(args, "rollout_data_dir", None)),
                      ("debug rollouts", args.save_debug_rollout_data)) if where), flush=True)
        return summaries
    finally:
        if manager is not None:
            try:
                ray.get(manager.shutdown.remote(), timeout=120)
            except Exception as e:  # noqa: BLE001 - shutting down after another error
                logger.warning("manager shutdown: %s", e)
        if started_ray:
            ray.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        args = parse_args(argv)
    except ArgError as e:
        print(f"slime-rollout: error: {e}", file=sys.stderr)
        return 2
    try:
        run(args)
    except KeyboardInterrupt:
        print("slime-rollout: interrupted; everything started was stopped", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - report the cause and the user's frames, not a Ray traceback
        print(describe(e, "slime-rollout"), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
