"""Command-line flags for dashboards, metric logs and rollout dumps.

The flags are `ObservabilityConfig`'s fields; the controller/manager parser calls
`add_observability_arguments(parser)`, generated from them. The metric logs and rollout dumps receive
`ReportConfig` (those flags and the core parser's few they also read), built once from the namespace by
whoever owns them (the rollout controller, the rollout manager, the trainer's metrics sink); nothing in
`slime.observability` reads a flag off `args` but slime's own helpers plugins call with it
(`rollout_metrics.compute_perf_metrics_from_samples`, `rollout_data_utils`'s routing-replay check).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from slime.utils.flag_config import FlagConfig, ParsedConfig, flag


@dataclass(frozen=True)
class ObservabilityConfig(FlagConfig):
    GROUP = "observability"

    use_wandb: bool = flag(
        False, action="store_true", help="Log rollout/eval/perf metrics and eval sample tables to Weights & Biases."
    )
    wandb_project: str = flag("slime", type=str)
    wandb_group: str | None = flag(None, type=str)
    wandb_run_name: str | None = flag(None, type=str)
    wandb_mode: str = flag(
        "offline",
        type=str,
        choices=["offline", "online", "disabled"],
        help="offline (default) needs no account or network; sync later with `wandb sync`.",
    )
    wandb_dir: str | None = flag(
        None, type=str, help="Where wandb writes its run directories (default: $WANDB_DIR, else ./outputs/wandb)."
    )
    wandb_always_use_train_step: bool = flag(
        False,
        action="store_true",
        help="Plot every namespace against the train step "
        "(rollout_id * rollout_batch_size * n_samples_per_prompt // global_batch_size).",
    )
    log_passrate: bool = flag(
        False,
        action="store_true",
        help="Also log eval/<name>-pass@k for k = 1, 2, 4, ... up to --n-samples-per-eval-prompt.",
    )
    rollout_data_dir: str | None = flag(
        None,
        type=str,
        help="Dump every rollout to {DIR}/{rollout_id}.jsonl (eval: {DIR}/eval/{dataset}/{rollout_id}.jsonl).",
    )
    metrics_dir: str | None = flag(
        None, type=str, help="Directory of metrics.jsonl (default: --rollout-data-dir, else the wandb run directory)."
    )


@dataclass(frozen=True)
class ReportConfig(ParsedConfig):
    """What the metrics, the metric logs and the rollout dumps read: the observability flags, the batch sizes
    slime's train step is computed from, the eval group size, the reward key and the checkpoint a dump names
    as its tokenizer."""

    observability: ObservabilityConfig
    rollout_batch_size: int
    n_samples_per_prompt: int
    global_batch_size: int | None
    n_samples_per_eval_prompt: int | None
    reward_key: str | None  # (`Sample.get_reward_value` reads it off this config as off slime's args)
    hf_checkpoint: str | None


def add_observability_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    return ObservabilityConfig.add_arguments(parser)
