"""Samples -> training batch, with slime's keys.

Rewards are normalised per *group* (`group_index`), whatever the group sizes: a batch whose
groups were filtered or partially failed is never normalised as one big group by accident.
Every per-token list is checked against `response_length`, and an error names the sample.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from slime.utils.types import Sample


class BatchError(ValueError):
    pass


def check_sample(s: Sample) -> None:
    who = f"sample index={s.index} group={s.group_index}"
    if s.response_length < 0 or s.response_length > len(s.tokens):
        raise BatchError(f"{who}: response_length {s.response_length} but {len(s.tokens)} tokens")
    if s.loss_mask is None or len(s.loss_mask) != s.response_length:
        raise BatchError(f"{who}: loss_mask has {None if s.loss_mask is None else len(s.loss_mask)} entries, "
                         f"response_length is {s.response_length}")
    if s.rollout_log_probs is not None and len(s.rollout_log_probs) != s.response_length:
        raise BatchError(f"{who}: rollout_log_probs has {len(s.rollout_log_probs)} entries, "
                         f"response_length is {s.response_length}")
    if s.group_index is None:
        raise BatchError(f"{who}: group_index is None (every sample needs its group for normalisation)")


def normalize_group_rewards(args: Any, samples: list[Sample], raw: list[float]) -> list[float]:
    estimator = getattr(args, "advantage_estimator", "grpo")
    if getattr(args, "disable_rewards_normalization", False) or estimator not in (
            "grpo", "gspo", "reinforce_plus_plus_baseline"):
        return list(raw)
    by_group: dict[Any, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        by_group[s.group_index].append(i)
    out = list(raw)
    use_std = estimator in ("grpo", "gspo") and not getattr(args, "disable_grpo_std_normalization", False)
    for idx in by_group.values():
        vals = [raw[i] for i in idx]
        mean = sum(vals) / len(vals)
        std = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else 0.0
        for i in idx:
            out[i] = (raw[i] - mean) / (std + 1e-6) if use_std else raw[i] - mean
    return out


def convert_samples_to_train_data(args: Any, samples: list[Sample]) -> dict[str, list]:
    """slime's `_convert_samples_to_train_data`: plain lists, one entry per sample."""
    if not samples:
        raise BatchError("no samples to convert (every sample failed or was filtered)")
    for s in samples:
        check_sample(s)
    raw = [s.get_reward_value(args) for s in samples]
    data: dict[str, list] = {
        "tokens": [list(s.tokens) for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rewards": normalize_group_rewards(args, samples, raw),
        "raw_reward": raw,
        "truncated": [1 if s.status == Sample.Status.TRUNCATED else 0 for s in samples],
        "sample_indices": [s.index for s in samples],
        "loss_masks": [list(s.loss_mask) for s in samples],
    }
    if all(s.rollout_log_probs is not None for s in samples):
        data["rollout_log_probs"] = [list(s.rollout_log_probs) for s in samples]
    if all("round_number" in s.metadata for s in samples):
        data["round_number"] = [s.metadata["round_number"] for s in samples]
    return data
