"""Samples -> training batch: slime's `_convert_samples_to_train_data`, run once per rollout just before it ships.

Plain Python values, one entry per sample (per-rank tensors are made by `slime.train_batch.rank_batches`).
Rewards stay as the reward function returned them until `post_process_rewards` (`reward_check.py` says when
they must be numbers). They are normalised per *group*: by `group_index` when every sample has one (whatever
the group sizes, so a batch whose groups were filtered or partly failed is never normalised as one big group
by accident), else by position as slime does (`normalization_groups`). Every per-token list is checked against
`response_length`, and an error (`BatchError`) names the sample. Per-token lists are shared with the samples,
not copied: conversion never mutates a sample. The keys are those `convert_samples_to_train_data` writes.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from slime.rollout.flags import RolloutConfig
from slime.rollout.reward_check import number_problem, reward_problem, reward_source
from slime.utils.misc import load_function
from slime.utils.types import Sample
from slime.utils.plugin_args import completed

logger = logging.getLogger(__name__)

CONVERT_FLAG = "--custom-convert-samples-to-train-data-path"
REWARD_FLAG = "--custom-reward-post-process-path"

# Keys whose entries are per-token lists of `response_length` (checked for every sample).
PER_TOKEN_KEYS = ("loss_masks", "rollout_log_probs", "teacher_log_probs")


class BatchError(ValueError):
    pass


def _who(s: Sample) -> str:
    return f"sample index={s.index} group={s.group_index}"


def check_sample(s: Sample) -> None:
    """Length invariants of one sample; `loss_mask=None` is allowed (it means "train on every token")."""
    who = _who(s)
    if s.response_length < 0 or s.response_length > len(s.tokens):
        raise BatchError(f"{who}: response_length {s.response_length} but {len(s.tokens)} tokens")
    if s.loss_mask is not None and len(s.loss_mask) != s.response_length:
        raise BatchError(f"{who}: loss_mask has {len(s.loss_mask)} entries, response_length is {s.response_length}")
    for name in ("rollout_log_probs", "teacher_log_probs"):
        values = getattr(s, name, None)
        if values is not None and len(values) != s.response_length:
            raise BatchError(f"{who}: {name} has {len(values)} entries, response_length is {s.response_length}")


def untrained_log_probs_filled(s: Sample, name: str, mask: list[int]) -> list[float] | None:
    """`s.<name>` with a None where the loss mask is 0 replaced by 0.0. Plugins leave None at tokens the
    model did not sample (strands-sglang records tool output so; slime's recipe copies it as is), and
    0.0 is what slime's `append_response_tokens(trainable=False)` stores there; the loss never reads it.
    A None at a trained token has no value to stand for: an error naming the sample and position."""
    values = getattr(s, name, None)
    if values is None or None not in values:  # (`in` tests identity first: a float is never None)
        return values
    trained = [i for i, v in enumerate(values) if v is None and mask[i]]
    if trained:
        raise BatchError(
            f"{_who(s)}: {name}[{trained[0]}] is None at a token the loss trains "
            f"(loss_mask 1): the engine's log-prob of a sampled token is needed"
        )
    return [0.0 if v is None else v for v in values]


def normalization_groups(args: Any, samples: list[Sample]) -> list[list[int]]:
    """Positions of the samples normalised together. With a `group_index` on every sample: by group.
    Without (a custom generate function that builds new Samples): by position, slime's
    `reshape(-1, n_samples_per_prompt)`, which needs the count to be a multiple of
    `--n-samples-per-prompt`; otherwise the groups' sizes differ and their boundaries are unknown,
    so the batch is one group (slime does the same) and a warning says so."""
    if all(s.group_index is not None for s in samples):
        by_group: dict[Any, list[int]] = defaultdict(list)
        for i, s in enumerate(samples):
            by_group[s.group_index].append(i)
        return list(by_group.values())
    n = int(args.n_samples_per_prompt or 1)
    if len(samples) % n == 0:
        return [list(range(i, i + n)) for i in range(0, len(samples), n)]
    logger.warning(
        "reward normalisation: %d samples lack group_index and %d is not a multiple of "
        "--n-samples-per-prompt %d, so the groups cannot be told apart; normalising the batch as one "
        "group (as slime does). Set Sample.group_index to normalise per group.",
        sum(s.group_index is None for s in samples),
        len(samples),
        n,
    )
    return [list(range(len(samples)))]


def normalize_group_rewards(args: Any, samples: list[Sample], raw: list[float]) -> list[float]:
    estimator = args.advantage_estimator
    if getattr(args, "disable_rewards_normalization", False) or estimator not in (
        "grpo",
        "gspo",
        "cispo",
        "reinforce_plus_plus_baseline",
    ):
        return list(raw)
    out = list(raw)
    use_std = estimator in ("grpo", "gspo", "cispo") and not getattr(args, "disable_grpo_std_normalization", False)
    for idx in normalization_groups(args, samples):
        vals = [raw[i] for i in idx]
        mean = sum(vals) / len(vals)
        std = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else 0.0
        for i in idx:
            out[i] = (raw[i] - mean) / (std + 1e-6) if use_std else raw[i] - mean
    return out


def _hook(args: Any, attr: str, flag: str):
    path = getattr(args, attr)
    return load_function(path, flag) if path else None


def post_process_rewards(args: Any, samples: list[Sample]) -> tuple[list[float], list[float]]:
    """slime's `_post_process_rewards`: `(raw_rewards, rewards)`, one entry per sample each.

    `--custom-reward-post-process-path fn(args, samples) -> (raw_rewards, rewards)` replaces the
    default group normalisation; anything else than two sequences of `len(samples)` is an error
    naming the flag (a silent mismatch would pair rewards with the wrong samples)."""
    args = completed(args)
    hook = _hook(args, "custom_reward_post_process_path", REWARD_FLAG)
    if hook is None:
        config = RolloutConfig.from_args(args)  # what reward_check reads: once a batch
        for s in samples:
            problem = reward_problem(config, s)
            if problem is not None:
                raise BatchError(f"{reward_source(config, s)} {problem} for {_who(s)}")
        raw = [float(s.get_reward_value(args)) for s in samples]
        return raw, normalize_group_rewards(args, samples, raw)
    out = hook(args, samples)
    where = f"{REWARD_FLAG} {args.custom_reward_post_process_path!r}"
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise BatchError(f"{where} returned {type(out).__name__}; expected (raw_rewards, rewards)")
    checked = []
    for name, values in zip(("raw_rewards", "rewards"), out):
        if hasattr(values, "tolist"):  # a tensor or array is fine
            values = values.tolist()
        if not isinstance(values, (list, tuple)):
            raise BatchError(
                f"{where} returned {name} as {type(values).__name__}; expected (raw_rewards, "
                f"rewards), each a list of {len(samples)} (one per sample)"
            )
        if len(values) != len(samples):
            raise BatchError(f"{where} returned {name} with {len(values)} entries for {len(samples)} samples")
        for s, v in zip(samples, values):
            problem = number_problem(v)
            if problem is not None:
                raise BatchError(f"{where} {problem} in {name} for sample index={s.index} group={s.group_index}")
        checked.append([float(v) for v in values])
    return checked[0], checked[1]


def assign_rollout_ids(ids: list[int | None]) -> list[int]:
    """Each None becomes the smallest id not used by any sample, so a sample without a rollout id
    is a rollout of its own and never merges with an annotated one."""
    used = {i for i in ids if i is not None}
    out, fresh = [], 0
    for rid in ids:
        if rid is None:
            while fresh in used:
                fresh += 1
            rid = fresh
            used.add(rid)
        out.append(rid)
    return out


def rollout_mask_sums(rollout_ids: list[int], loss_masks: list[Any]) -> list[int]:
    """Per sample, the loss-mask total of its whole rollout: the denominator that keeps a token-level
    loss exact when one rollout's samples land in different micro-batches or ranks."""
    per_sample = [int(sum(m)) for m in loss_masks]
    totals: dict[int, int] = defaultdict(int)
    for rid, n in zip(rollout_ids, per_sample):
        totals[rid] += n
    return [totals[rid] for rid in rollout_ids]


def _source(s: Sample) -> str | None:
    # `source` is no Sample field: a plugin's attribute, or an unknown field kept by from_dict (extra_fields);
    # read from the instance dict, as `getattr` would find it, without raising AttributeError per sample
    fields = s.__dict__ if type(s) is Sample else None
    src = (
        (fields.get("source") or (fields.get("extra_fields") or {}).get("source"))
        if fields
        else getattr(s, "source", None)
    )
    if src:
        return src
    meta = s.metadata or {}
    return meta.get("source_name") or None


def convert_samples_to_train_data(args: Any, samples: list[Sample]) -> dict[str, list]:
    """slime's `_convert_samples_to_train_data`: plain lists, one entry per sample.

    `--custom-convert-samples-to-train-data-path fn(args, samples) -> dict` replaces it; its output is
    checked by `check_custom_train_data` and completed with `total_lengths`, `rollout_ids` and
    `rollout_mask_sums` when it lacks them."""
    args = completed(args)
    if not samples:
        raise BatchError("no samples to convert (every sample failed or was filtered)")
    hook = _hook(args, "custom_convert_samples_to_train_data_path", CONVERT_FLAG)
    if hook is not None:
        return check_custom_train_data(args, samples, hook(args, samples))
    for s in samples:
        check_sample(s)
    raw, rewards = post_process_rewards(args, samples)
    meta_raw = [(s.metadata or {}).get("raw_reward") for s in samples]
    if any(v is not None for v in meta_raw):  # e.g. a task reward kept apart from a shaped one
        raw = [m if m is not None else r for m, r in zip(meta_raw, raw)]

    loss_masks = []
    for s in samples:
        if getattr(s, "remove_sample", False):
            loss_masks.append([0] * s.response_length)
        elif s.loss_mask is None:  # slime's rule: plugins written for slime never set it
            loss_masks.append([1] * s.response_length)
        else:
            loss_masks.append(s.loss_mask)
    rollout_ids = assign_rollout_ids([getattr(s, "rollout_id", None) for s in samples])

    data: dict[str, list] = {
        "tokens": [s.tokens for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "total_lengths": [len(s.tokens) for s in samples],
        "rewards": rewards,
        "raw_reward": raw,
        "truncated": [1 if s.status == Sample.Status.TRUNCATED else 0 for s in samples],
        "sample_indices": [s.index for s in samples],
        "rollout_ids": rollout_ids,
        "loss_masks": loss_masks,
        "rollout_mask_sums": rollout_mask_sums(rollout_ids, loss_masks),
        "weight_versions": [list(getattr(s, "weight_versions", None) or []) for s in samples],
    }
    for key in ("rollout_log_probs", "teacher_log_probs"):
        values = [untrained_log_probs_filled(s, key, mask) for s, mask in zip(samples, loss_masks)]
        if all(v is not None for v in values):
            data[key] = values
    for key, attr in (
        ("rollout_top_p_token_ids", "rollout_top_p_token_ids"),
        ("rollout_top_p_token_offsets", "rollout_top_p_token_offsets"),
        ("rollout_routed_experts", "rollout_routed_experts"),
    ):
        values = [getattr(s, attr, None) for s in samples]
        if all(v is not None for v in values):
            data[key] = values
    if all("round_number" in (s.metadata or {}) for s in samples):
        data["round_number"] = [s.metadata["round_number"] for s in samples]
    sources = [_source(s) for s in samples]
    if any(sources):
        data["source_names"] = [src or "unknown" for src in sources]
    train_meta = [getattr(s, "train_metadata", None) for s in samples]
    if any(m is not None for m in train_meta):
        data["metadata"] = train_meta
    mm = [getattr(s, "multimodal_train_inputs", None) for s in samples]
    if any(m is not None for m in mm):
        data["multimodal_train_inputs"] = mm
    return data


def check_custom_train_data(args: Any, samples: list[Sample], data: Any) -> dict[str, list]:
    """What a custom convert hook returned must be a batch the trainer can read: a dict with at least
    `tokens`, `response_lengths`, `rewards` and `loss_masks`, every per-sample list of one length, and
    per-token lists of `response_length`. Errors name the flag and the entry."""
    where = f"{CONVERT_FLAG} {args.custom_convert_samples_to_train_data_path!r}"
    if not isinstance(data, dict):
        raise BatchError(f"{where} returned {type(data).__name__}; expected a dict of per-sample lists")
    missing = [k for k in ("tokens", "response_lengths", "rewards", "loss_masks") if k not in data]
    if missing:
        raise BatchError(f"{where} returned a dict without {missing}")
    n = len(data["tokens"])
    if n == 0:
        raise BatchError(f"{where} returned no samples")
    for key, values in data.items():
        if (
            key
            in (
                "tokens",
                "response_lengths",
                "rewards",
                "loss_masks",
                "raw_reward",
                "rollout_ids",
                "total_lengths",
                "rollout_mask_sums",
                *PER_TOKEN_KEYS,
            )
            and len(values) != n
        ):
            raise BatchError(f"{where}: {key!r} has {len(values)} entries, 'tokens' has {n}")
    for i in range(n):
        rl, nt = data["response_lengths"][i], len(data["tokens"][i])
        if rl < 0 or rl > nt:
            raise BatchError(f"{where}: entry {i}: response_length {rl} but {nt} tokens")
        for key in PER_TOKEN_KEYS:
            if key in data and data[key][i] is not None and len(data[key][i]) != rl:
                raise BatchError(f"{where}: entry {i}: {key} has {len(data[key][i])} entries, response_length is {rl}")
    out = dict(data)
    out.setdefault("total_lengths", [len(t) for t in data["tokens"]])
    if "rollout_ids" not in out:
        own = [getattr(s, "rollout_id", None) for s in samples] if len(samples) == n else [None] * n
        out["rollout_ids"] = assign_rollout_ids(own)
    out.setdefault("rollout_mask_sums", rollout_mask_sums(out["rollout_ids"], out["loss_masks"]))
    out.setdefault("raw_reward", list(out["rewards"]))
    return out
