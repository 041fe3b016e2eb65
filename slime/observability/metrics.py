"""Pure functions from samples to the metric dicts we log (`rollout/*`, `perf/*`, `eval/*`).

Kept free of wandb and I/O so the controller, the report and the tests all agree on one
definition of every number.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable

from slime.observability.flags import ReportConfig
from slime.utils.trajectory import TrajectoryRecord
from slime.utils.types import Sample

PASS_AT_K_THRESHOLD = 1.0  # a sample solves its prompt when its reward reaches this (slime's `reward == 1`)

# --------------------------------------------------------------------------- helpers


def flatten_samples(samples: Iterable[Any]) -> list[Sample]:
    """Accept both a flat list and slime's `list[list[Sample]]` groups."""
    out: list[Sample] = []
    for s in samples or []:
        if isinstance(s, (list, tuple)):
            out.extend(flatten_samples(s))
        else:
            out.append(s)
    return out


def group_samples(samples: Iterable[Any]) -> list[list[Sample]]:
    """Groups as slime builds them: nested lists are kept, flat lists are grouped by `group_index`."""
    samples = list(samples or [])
    if samples and all(isinstance(s, (list, tuple)) for s in samples):
        return [list(g) for g in samples]
    groups: dict[Any, list[Sample]] = defaultdict(list)
    for i, s in enumerate(samples):
        groups[s.group_index if s.group_index is not None else f"_{i}"].append(s)
    return list(groups.values())


def reward_value(keyed: Any, sample: Sample) -> float:
    """Scalar reward for metrics and dumps: `get_reward_value` (slime's; `keyed` holds --reward-key: a
    `ReportConfig`, slime's args, or None), a raw dict reward's "score" entry when no --reward-key picks one
    (verl's convention); anything else that is not a number counts as NaN instead of killing the logger."""
    try:
        return scalar(sample.get_reward_value(keyed))
    except (KeyError, TypeError):
        return float("nan")


def scalar(value: Any) -> float:
    """A reward as one float: numbers as they are, a dict's "score" entry, anything else NaN."""
    if isinstance(value, dict):
        value = value.get("score")
    try:
        return float("nan") if isinstance(value, (str, bytes)) else float(value)
    except (TypeError, ValueError):
        return float("nan")


def stats(
    prefix: str, values: list[float], which: tuple[str, ...] = ("mean", "std", "min", "max", "median")
) -> dict[str, float]:
    """`{prefix}_mean`, `{prefix}_std`, ... over the finite values; empty input gives no keys."""
    vals = sorted(float(v) for v in values if v is not None and math.isfinite(float(v)))
    if not vals:
        return {}
    n = len(vals)
    mean = sum(vals) / n
    out = {
        "mean": mean,
        "std": math.sqrt(sum((v - mean) ** 2 for v in vals) / n),
        "min": vals[0],
        "max": vals[-1],
        "median": vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2,
        "p90": vals[min(n - 1, math.ceil(0.9 * n) - 1)],
    }
    return {f"{prefix}_{k}": out[k] for k in which}


def trajectories(flat: list[Sample]) -> list[TrajectoryRecord | None]:
    """The tool loop's record of each sample (None for single-turn samples)."""
    return [TrajectoryRecord.of(s) for s in flat]


def train_step(config: ReportConfig, rollout_id: int) -> int:
    """slime's train step for a rollout: rollout_id * rollout_batch_size * n_samples_per_prompt // global_batch_size."""
    rbs = config.rollout_batch_size
    n = config.n_samples_per_prompt
    gbs = config.global_batch_size
    if not rbs or not gbs:
        return int(rollout_id)
    return int(rollout_id) * int(rbs) * int(n) // int(gbs)


def log_step(config: ReportConfig, rollout_id: int) -> int:
    """The x value for rollout/perf/eval: the rollout id, or the train step with --wandb-always-use-train-step."""
    if config.observability.wandb_always_use_train_step:
        return train_step(config, rollout_id)
    return int(rollout_id)


# --------------------------------------------------------------------------- rollout / perf


def compute_rollout_metrics(
    config: ReportConfig | None, rollout_id: int, samples: list, perf: dict | None = None
) -> dict[str, float]:
    """`rollout/*` quality metrics and `perf/*` speed metrics for one training rollout.

    `perf` is what the rollout loop measured: numbers pass through as `perf/<key>`, one-level
    dicts (e.g. `{"engine": {"requests", "retries", "failures"}}`) flatten to `perf/<key>_<sub>`.
    `rollout_time` (seconds) is used to derive `perf/tokens_per_s`.
    """
    flat = flatten_samples(samples)
    m: dict[str, float] = {"rollout/num_samples": len(flat)}
    records = trajectories(flat)  # validated once, read by the multi-turn and the perf metrics
    if flat:
        rewards = [reward_value(config, s) for s in flat]
        lengths = [s.response_length for s in flat]
        m.update(stats("rollout/reward", rewards, ("mean", "std", "min", "max")))
        m.update(stats("rollout/response_len", lengths, ("mean", "std", "min", "max", "median", "p90")))
        for status in (Sample.Status.TRUNCATED, Sample.Status.ABORTED, Sample.Status.FAILED):
            m[f"rollout/{status.value}_ratio"] = sum(s.status == status for s in flat) / len(flat)
        groups = [g for g in group_samples(samples) if len(g) > 1]
        m["rollout/num_groups"] = len(group_samples(samples))
        if groups:
            zero = sum(1 for g in groups if _spread(reward_value(config, s) for s in g) == 0.0)
            m["rollout/zero_std_groups"] = zero
            m["rollout/zero_std_group_ratio"] = zero / len(groups)
        masks = [s.loss_mask for s in flat if s.loss_mask]
        if masks:
            m["rollout/trained_token_ratio"] = sum(sum(mk) for mk in masks) / max(1, sum(len(mk) for mk in masks))
        m.update(_multi_turn_metrics(flat, records))
        m.update(_reward_detail_metrics(flat))
    m.update(compute_perf_metrics(flat, perf or {}, records))
    return m


def _spread(values: Iterable[float]) -> float:
    vals = [v for v in values if math.isfinite(v)]
    return (max(vals) - min(vals)) if vals else 0.0


def _multi_turn_metrics(flat: list[Sample], recs: list[TrajectoryRecord | None]) -> dict[str, float]:
    """Turns, tool calls and error counts (the lengths of the error records) from each `TrajectoryRecord`.

    Single-turn samples in the same rollout count as one turn without calls or errors.
    """
    if not any(recs):
        return {}
    n = len(flat)
    m: dict[str, float] = {}
    m.update(stats("rollout/turns", [(r.turns if r else 0) or 1 for r in recs], ("mean", "max")))
    per_tool: dict[str, int] = defaultdict(int)
    total_calls = []
    for r in recs:
        counts = r.tool_calls if r else {}
        total_calls.append(sum(counts.values()))
        for k, v in counts.items():
            per_tool[k] += v
    m["rollout/tool_calls_per_sample"] = sum(total_calls) / n
    m["rollout/samples_with_tool_calls_ratio"] = sum(1 for c in total_calls if c) / n
    for k, v in per_tool.items():
        m[f"rollout/tool_calls/{k}"] = v
    for key in ("tool_errors", "parse_errors"):
        total = sum(len(getattr(r, key)) for r in recs if r)
        m[f"rollout/{key}"] = total
        m[f"rollout/{key}_per_sample"] = total / n
    return m


def _reward_detail_metrics(flat: list[Sample]) -> dict[str, float]:
    """Mean of each numeric component of dict rewards (`rollout/reward/<key>`)."""
    comps: dict[str, list[float]] = defaultdict(list)
    for s in flat:
        if isinstance(s.reward, dict):
            for k, v in s.reward.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    comps[str(k)].append(float(v))
    return {f"rollout/reward/{k}": sum(v) / len(v) for k, v in comps.items() if v}


def compute_perf_metrics(
    flat: list[Sample], perf: dict, records: list[TrajectoryRecord | None] | None = None
) -> dict[str, float]:
    """`perf/*`: what the loop measured, plus tokens/s and tool time (`records`: `trajectories(flat)`)."""
    m: dict[str, float] = {}
    for k, v in perf.items():
        if isinstance(v, bool):
            v = int(v)
        if isinstance(v, (int, float)):
            # keys that already name their namespace ("perf/x", "rollout/x") keep it
            m[k if "/" in str(k) else f"perf/{k}"] = float(v)
        elif isinstance(v, dict):
            for sk, sv in v.items():
                if isinstance(sv, (int, float)) and not isinstance(sv, bool):
                    m[f"perf/{k}_{sk}"] = float(sv)
    tokens = sum(s.response_length for s in flat)
    m["perf/response_tokens"] = tokens
    elapsed = perf.get("rollout_time", perf.get("perf/rollout_time"))
    if isinstance(elapsed, (int, float)) and elapsed > 0:
        m["perf/tokens_per_s"] = tokens / elapsed
    if flat:
        m["perf/longest_sample_tokens"] = max(s.response_length for s in flat)
        records = trajectories(flat) if records is None else records
        tool_time = [r.non_generation_time if r else 0.0 for r in records]
        if any(tool_time):
            m["perf/tool_time_total"] = sum(tool_time)
            m["perf/tool_time_max"] = max(tool_time)
            m["perf/tool_time_per_sample"] = sum(tool_time) / len(flat)
    return m


# --------------------------------------------------------------------------- eval


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def _eval_groups(samples: list[Sample], rewards: list[float], group_size: int) -> list[list[float]]:
    """Rewards per prompt: by `group_index` when samples carry it, else consecutive chunks."""
    if samples and len(samples) == len(rewards) and all(s.group_index is not None for s in samples):
        by: dict[Any, list[float]] = defaultdict(list)
        for s, r in zip(samples, rewards):
            by[s.group_index].append(r)
        return list(by.values())
    return [rewards[i : i + group_size] for i in range(0, len(rewards), group_size)]


def compute_eval_metrics(config: ReportConfig, rollout_id: int, eval_data: dict) -> dict[str, float]:
    """`eval/<name>`, `eval/<name>-truncated_ratio`, `eval/<name>-pass@k`, response-length stats.

    `eval_data` is slime's `{name: {"rewards": [...], "truncated": [...], "samples": [...]}}`;
    a sample counts as solved for pass@k when its reward >= `PASS_AT_K_THRESHOLD` (slime's `reward == 1`).
    """
    m: dict[str, float] = {}
    group_size = int(config.n_samples_per_eval_prompt or 1)
    threshold = PASS_AT_K_THRESHOLD
    for name, data in (eval_data or {}).items():
        data = getattr(data, "data", data)  # tolerate RolloutFnEvalOutput-like wrappers
        samples = flatten_samples(data.get("samples") or [])
        rewards = data.get("rewards")
        if rewards is None:
            rewards = [reward_value(config, s) for s in samples]
        rewards = [scalar(r) for r in rewards]
        truncated = data.get("truncated")
        if truncated is None:
            truncated = [s.status == Sample.Status.TRUNCATED for s in samples]
        numbers = [r for r in rewards if r == r]  # NaN: not a number
        if numbers:
            m[f"eval/{name}"] = sum(numbers) / len(numbers)
        if truncated:
            m[f"eval/{name}-truncated_ratio"] = sum(bool(t) for t in truncated) / len(truncated)
        if samples:
            m.update(
                stats(
                    f"eval/{name}-response_len", [s.response_length for s in samples], ("mean", "median", "max", "min")
                )
            )
            turns = [r.turns if r else 0 for r in trajectories(samples)]
            if any(turns):
                m[f"eval/{name}-turns_mean"] = sum(turns) / len(turns)
        if config.observability.log_passrate and rewards:
            groups = _eval_groups(samples, rewards, group_size)
            n = min(len(g) for g in groups)
            k = 1
            while k <= n:
                m[f"eval/{name}-pass@{k}"] = sum(
                    pass_at_k(len(g), sum(r >= threshold for r in g), k) for g in groups
                ) / len(groups)
                k *= 2
    return m
