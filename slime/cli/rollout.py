"""`slime-rollout` / `python -m slime`: run evals and rollouts end to end and print a summary.

This is slime's `--debug-rollout-only` path: no trainer, the batches are built (and optionally
saved) exactly as a trainer would receive them. Every input is checked before anything starts
(`preflight`). Ctrl-C and SIGTERM (what schedulers and `timeout` send) stop everything that was
started, the same orderly way; `--load DIR` resumes at the saved rollout id + 1.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

from slime.cli.args import parse_args
from slime.cli.command import run_cli
from slime.ray.session import format_startup, start_manager, stop_manager
from slime.ray.session import ray_init as _ray_init
from slime.utils.startup_trace import mark


def _format_summary(s: dict[str, Any]) -> str:
    reasons = s.get("failure_reasons") or {}
    failed = f"{s['failed']}" + (f" ({', '.join(f'{k}={v}' for k, v in reasons.items())})" if reasons else "")
    engines = "".join(f" {k}={s[k]}" for k in ("engine_deaths", "engine_restarts") if s.get(k))
    lost = s.get("lost_nodes") or []
    nodes = f" nodes_lost={len(lost)} ({'; '.join(lost)})" if lost else ""
    return (
        f"rollout {s['rollout_id']}: samples={s['samples']} mean_reward={s['mean_reward']:.4f} "
        f"truncated_ratio={s['truncated_ratio']:.3f} failed={failed} tokens/s={s['tokens_per_s']:.1f} "
        f"time={s['seconds']:.2f}s engine_retries={s['engine_retries']}{engines}{nodes}"
    )


class EngineStateLog:
    """Prints a line whenever an engine changes state (dead, restarting, healthy again, failed)."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[str, int]] = {}

    def update(self, engines: list[dict[str, Any]]) -> None:
        for e in engines or []:
            key = (e["state"], e.get("deaths", 0))
            before = self.seen.get(e["rank"])
            self.seen[e["rank"]] = key
            if before is None or before == key:
                continue
            detail = {
                "dead": f"died (exit code {e.get('last_exit')})",
                "restarting": f"died (exit code {e.get('last_exit')}); restarting (restart {e['restarts']})",
                "healthy": f"serving again at {e['url']} after {e['restarts']} restart(s)",
                "failed": f"failed for good after {e['restarts']} restart(s) (last: {e.get('last_exit')})",
                "unplaced": "has no room on the surviving nodes: the pool goes on without it until a node "
                "with room joins",
            }
            print(f"warning: engine {e['rank']} {detail.get(e['state'], e['state'])}", file=sys.stderr, flush=True)


def _wait(ref: Any, manager: Any, description: str, engine_log: EngineStateLog | None = None) -> Any:
    """Wait for an actor call, showing live progress from the manager's status query."""
    import ray

    from slime.observability.progress import RolloutProgress

    with RolloutProgress(total=0, description=description) as bar:
        while True:
            done, _ = ray.wait([ref], timeout=0.5)
            st = ray.get(manager.status.remote())
            bar.update(
                total=st.get("target"),
                done=st.get("done"),
                in_flight=st.get("in_flight"),
                tokens=st.get("tokens"),
                retries=st.get("retries"),
            )
            if engine_log is not None:
                engine_log.update(st.get("engines"))
            if done:
                return ray.get(ref)


def run(args: Any) -> list[dict[str, Any]]:
    """Start the manager, run the evals and rollouts, stop everything (inputs already checked)."""
    from slime.engine.default_model import resolve_hf_checkpoint

    resolve_hf_checkpoint(args)
    # Cold start: the manager's module (Ray, the fleet) is imported while Ray starts, on a thread `ray_init`
    # starts once it has checked for a running Ray and started the engine fork server (whose preload begins first)
    session = _ray_init(args, import_meanwhile="slime.ray.rollout_manager")
    try:
        RolloutManager = session.imported().RolloutManager  # noqa: N806 - a class
    except BaseException:
        session.stop()
        raise
    import ray

    manager = None
    summaries: list[dict[str, Any]] = []
    engine_log = EngineStateLog()
    try:
        manager, info = start_manager(args, RolloutManager, fork_server=session.fork_server_socket)
        startup = format_startup(info)
        if startup:
            print(startup, flush=True)
        engine_log.update(info.get("engines"))

        def evaluate(rollout_id: int) -> None:
            result = _wait(manager.eval.remote(rollout_id), manager, f"eval {rollout_id}", engine_log)
            for name, r in result.items():
                print(
                    f"eval {rollout_id} [{name}]: samples={r['samples']} mean_reward={r['mean_reward']:.4f} "
                    f"truncated_ratio={r['truncated_ratio']:.3f}",
                    flush=True,
                )

        if args.eval_datasets and not args.skip_eval_before_train and not args.load_debug_rollout_data:
            evaluate(args.start_rollout_id)
        for rollout_id in range(args.start_rollout_id, args.num_rollout):
            box = _wait(manager.generate.remote(rollout_id), manager, f"rollout {rollout_id}", engine_log)
            ray.get(box.inner)  # the batch, as a trainer would fetch it
            summary = ray.get(manager.last_summary.remote())
            summaries.append(summary)
            print(_format_summary(summary), flush=True)
            if (
                args.eval_datasets
                and args.eval_interval
                and (rollout_id + 1) % args.eval_interval == 0
                and not args.load_debug_rollout_data
            ):
                evaluate(rollout_id + 1)
        if summaries:
            n = sum(s["samples"] for s in summaries)
            mean = sum(s["mean_reward"] * s["samples"] for s in summaries) / max(1, n)
            print(
                f"done: {len(summaries)} rollout(s), {n} samples, mean_reward={mean:.4f}, "
                f"{sum(s['seconds'] for s in summaries):.1f}s in rollouts"
                + "".join(
                    f"; {what} in {where}"
                    for what, where in (
                        ("dumps", args.rollout_data_dir),
                        ("debug rollouts", args.save_debug_rollout_data),
                    )
                    if where
                ),
                flush=True,
            )
        return summaries
    finally:
        mark("exit: last line printed")
        stop_manager(manager)  # (None: nothing started, or start_manager already stopped it)
        mark("exit: manager stopped")
        session.stop()  # Ray (if ours) and the engine fork server: nothing outlives the command


def main(argv: Sequence[str] | None = None) -> int:
    """The command (`run_cli`: preflight, lifeline, signals, exit codes)."""
    return run_cli("slime-rollout", argv, parse_args, run)


if __name__ == "__main__":
    sys.exit(main())
