"""slime's `slime.observability.rollout_metrics` names, for rollout-log plugins
(`--custom-rollout-log-function-path` and the like) that compute or log slime's rollout metrics
themselves: `compute_metrics_from_samples`, `compute_perf_metrics_from_samples` (slime's keys:
`response_len/*`, `truncated_ratio`, `rollout_time`, `longest_sample_tokens_per_sec`, ...), and
`log_rollout_data` / `log_eval_rollout_data`, which log through this project's reporting (wandb and
the metrics log, `slime.observability.reporting`).
"""

from __future__ import annotations

from typing import Any

from slime.observability.flags import ReportConfig
from slime.observability.metrics import flatten_samples, stats
from slime.utils.types import Sample

STAT_NAMES = ("mean", "std", "min", "max", "median")


def _with_slash(prefix: str, values: list[float]) -> dict[str, float]:
    return {k.replace(f"{prefix}_", f"{prefix}/", 1): v for k, v in stats(prefix, values, STAT_NAMES).items()}


def compute_metrics_from_samples(args: Any, samples: list[Sample]) -> dict[str, float]:
    """Response-length statistics (effective lengths: loss-masked tokens) and the truncated fraction."""
    flat = flatten_samples(samples)
    out = _with_slash("response_len", [s.effective_response_length for s in flat])
    if flat:
        out["truncated_ratio"] = sum(s.status == Sample.Status.TRUNCATED for s in flat) / len(flat)
    return out


def compute_perf_metrics_from_samples(args: Any, samples: list[Sample], rollout_time: float) -> dict[str, float]:
    """Throughput of the rollout: the longest sample's tokens per second, per GPU with GPUs."""
    flat = flatten_samples(samples)
    out: dict[str, float] = {"rollout_time": rollout_time}
    waits = [s.non_generation_time for s in flat]
    if waits and max(waits) > 0:
        out.update(_with_slash("non_generation_time", waits))
    for key, lengths in (
        ("", [s.response_length for s in flat]),
        ("effective_", [s.effective_response_length for s in flat]),
    ):
        if not lengths or rollout_time <= 0:
            continue
        if args.rollout_num_gpus:
            out[f"{key}tokens_per_gpu_per_sec"] = sum(lengths) / rollout_time / args.rollout_num_gpus
        out[f"longest_{key}sample_tokens_per_sec"] = max(lengths) / rollout_time
    return out


def log_rollout_data(
    rollout_id: int, args: Any, samples: list[Sample], rollout_extra_metrics: dict | None, rollout_time: float
) -> dict:
    """Log a rollout's metrics as this project does (the extra metrics beside them)."""
    from slime.observability.reporting import log_rollout

    perf = {"rollout_time": rollout_time, **(rollout_extra_metrics or {})}
    return log_rollout(ReportConfig.from_args(args), rollout_id, samples, perf)


def log_eval_rollout_data(rollout_id: int, args: Any, data: dict, extra_metrics: dict | None = None) -> dict:
    from slime.observability.reporting import log_eval

    return {**log_eval(ReportConfig.from_args(args), rollout_id, data), **(extra_metrics or {})}
