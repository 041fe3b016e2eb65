"""Command-line flags for dashboards, metric logs and rollout dumps.

The controller/manager parser calls `add_observability_arguments(parser)`; every reader in this
package uses `getattr(args, name, default)` so a partial namespace (tests, scripts) still works.
"""

from __future__ import annotations

import argparse


def add_observability_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    g = parser.add_argument_group("observability")
    g.add_argument("--use-wandb", action="store_true", default=False,
                   help="Log rollout/eval/perf metrics and eval sample tables to Weights & Biases.")
    g.add_argument("--wandb-project", type=str, default="slime")
    g.add_argument("--wandb-group", type=str, default=None)
    g.add_argument("--wandb-run-name", type=str, default=None)
    g.add_argument("--wandb-mode", type=str, default="offline", choices=["offline", "online", "disabled"],
                   help="offline (default) needs no account or network; sync later with `wandb sync`.")
    g.add_argument("--wandb-dir", type=str, default=None,
                   help="Where wandb writes its run directories (default: $WANDB_DIR, else ./outputs/wandb).")
    g.add_argument("--wandb-always-use-train-step", action="store_true", default=False,
                   help="Plot every namespace against the train step "
                        "(rollout_id * rollout_batch_size * n_samples_per_prompt // global_batch_size).")
    g.add_argument("--log-passrate", action="store_true", default=False,
                   help="Also log eval/<name>-pass@k for k = 1, 2, 4, ... up to --n-samples-per-eval-prompt.")
    g.add_argument("--rollout-data-dir", type=str, default=None,
                   help="Dump every rollout to {DIR}/{rollout_id}.jsonl "
                        "(eval: {DIR}/eval/{dataset}/{rollout_id}.jsonl).")
    g.add_argument("--metrics-dir", type=str, default=None,
                   help="Directory of metrics.jsonl (default: --rollout-data-dir, else the wandb run directory).")
    return parser
