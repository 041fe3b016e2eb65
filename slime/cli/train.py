"""`slime-train` / `python -m slime.train`: slime's training loop with the reference trainer.

Takes every flag `slime-rollout` takes (slime's and Megatron-LM's names) plus the trainer's own
(`slime.train.flags`: --actor-num-workers, --actor-num-cpus-per-worker, --train-threads,
--weight-sync). Prints one line per rollout. Starts, fails and stops exactly as `slime-rollout` does
(`command.run_cli`): nothing it started outlives it, and SIGTERM takes Ctrl-C's orderly stop.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

from slime.cli.args import ArgError, parse_args
from slime.cli.command import run_cli

PROG = "slime-train"


def parse_train_args(argv: Sequence[str] | None = None) -> Any:
    """parse_args (whose parser declares the trainer's flags, `TrainConfig`), plus the trainer's checks."""
    from slime.train.flags import LoopConfig, check_train_arguments

    args = parse_args(list(sys.argv[1:] if argv is None else argv), prog=PROG)
    args.trains_model = True  # preflight: --load is a model checkpoint, --save needs room for one
    if args.debug_rollout_only:
        raise ArgError("--debug-rollout-only: nothing to train; use slime-rollout")
    if args.actor_num_workers < 1:
        raise ArgError(f"--actor-num-workers must be >= 1, got {args.actor_num_workers}")
    if args.save_interval is not None and not args.save:
        raise ArgError("--save-interval needs --save DIR")
    try:
        check_train_arguments(LoopConfig.from_args(args))
    except ValueError as e:
        raise ArgError(str(e)) from e
    return args


def run(args: Any) -> list[Any]:
    """Train (inputs already checked by `run_cli`) and print one closing line."""
    from slime.ray.session import ray_session
    from slime.train.loop import train

    if args.hf_checkpoint is None:
        from slime.engine.default_model import ensure_default_model

        args.hf_checkpoint = str(ensure_default_model())
    with ray_session(args) as session:  # Ray's start keeps our SIGTERM handler (slime.ray.keep_sigterm)
        records = train(args, fork_server=session.fork_server_socket)
    if records:
        rewards = [r.raw_reward for r in records if r.raw_reward is not None]
        diffs = [
            r.rollout.get("train_rollout_logprob_abs_diff")
            for r in records
            if r.rollout.get("train_rollout_logprob_abs_diff") is not None
        ]
        print(
            f"done: {len(records)} rollout(s) trained"
            + (f", reward {rewards[0]:.4f} -> {rewards[-1]:.4f}" if rewards else "")
            + (f", max train/rollout log-prob diff {max(diffs):.2e}" if diffs else ""),
            flush=True,
        )
    return records


def main(argv: Sequence[str] | None = None) -> int:
    """The command (`run_cli`: preflight, lifeline, signals, exit codes)."""
    return run_cli(PROG, argv, parse_train_args, run)


if __name__ == "__main__":
    sys.exit(main())
