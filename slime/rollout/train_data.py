"""Samples -> training batch, with slime's full key set.

Rewards are normalised per *group* (`group_index`), whatever the group sizes: a batch whose
groups were filtered or partially failed is never normalised as one big group by accident.
Every per-token list is checked against `response_length`, and an error names the sample.

The batch holds plain Python values, one entry per sample (the per-rank tensors are made by
`slime.train_batch.rank_batches`). Per-token lists are shared with the samples, not copied:
conversion never mutates a sample, and a rollout is converted once, just before it is shipped.

Keys (slime's `_convert_samples_to_train_data`): `tokens`, `response_lengths`, `total_lengths`,
`rewards`, `raw_reward`, `truncated`, `sample_indices`, `rollout_ids`, `loss_masks`,
`rollout_mask_sums`, `weight_versions`; when the samples carry them: `rollout_log_probs`,
`teacher_log_probs`, `round_number`, `source_names`, `metadata` (train metadata),
`multimodal_train_inputs`, `rollout_top_p_token_ids`/`_offsets`, `rollout_routed_experts`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from slime.utils.misc import load_function
from slime.utils.types import Sample

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
        raise BatchError(f"{who}: loss_mask has {len(s.loss_mask)} entries, "
                         f"response_length is {s.response_length}")
    for name in ("rollout_log_probs", "teacher_log_probs"):
        values = getattr(s, name, None)
        if values is not None and len(values) != s.response_length:
            raise BatchError(f"{who}: {name} has {len(values)} entries, response_length is {s.response_length}")
    if s.group_index is None:
        raise BatchError(f"{who}: group_index is None (every sample needs its group for normalisation)")


def normalize_group_rewards(args: Any, samples: list[Sample], raw: list[float]) -> list[float]:
    estimator = getattr(args, "advantage_estimator", "grpo")
    if getattr(args, "disable_rewards_normalization", False) or estimator not in (
            "grpo", "gspo", "cispo", "reinforce_plus_plus_baseline"):
        return list(raw)
    by_group: dict[Any, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        by_group[s.group_index].append(i)
    out = list(raw)
    use_std = estimator in ("grpo", "gspo", "cispo") and not getattr(args, "disable_grpo_std_normalization", False)
    for idx in by_group.values():
        vals = [raw[i] for i in idx]
        mean = sum(vals) / len(vals)
        std = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else 0.0
        for i in idx:
            out[i] = (raw[i] - mean) / (std + 1e-6) if use_std else raw[i] - mean
    return out


def _hook(args: Any, attr: str, flag: str):
    path = getattr(args, attr, None)
    return load_function(path, flag) if path else None


def post_process_rewards(args: Any, samples: list[Sample]) -> tuple[list[float], list[float]]:
    """slime's `_post_process_rewards`: `(raw_rewards, rewards)`, one entry per sample each.

    `--custom-reward-post-process-path fn(args, samples) -> (raw_rewards, rewards)` replaces the
    default group normalisation; anything else than two sequences of `len(samples)` is an error
    naming the flag (a silent mismatch would pair rewards with the wrong samples)."""
    hook = _hook(args, "custom_reward_post_process_path", REWARD_FLAG)
    if hook is None:
        raw = [s.get_reward_value(args) for s in samples]
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
            raise BatchError(f"{where} returned {name} as {type(values).__name__}; expected (raw_rewards, "
                             f"rewards), each a list of {len(samples)} (one per sample)")
        if len(values) != len(samples):
            raise BatchError(f"{where} returned {name} with {len(values)} entries for {len(samples)} samples")
        checked.append(list(values))
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
    src = getattr(s, "source", None)
    if src:
        return src
    meta = s.metadata or {}
    return meta.get("source_name") or None


def convert_samples_to_train_data(args: Any, samples: list[Sample]) -> dict[str, list]:
    """slime's `_convert_samples_to_train_data`: plain lists, one entry per sample.

    `--custom-convert-samples-to-train-data-path fn(args, samples) -> dict` replaces it; its output is
    checked by `check_custom_train_data` and completed with `total_lengths`, `rollout_ids` and
    `rollout_mask_sums` when it lacks them."""
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
    for key, attr in (("rollout_log_probs", "rollout_log_probs"), ("teacher_log_probs", "teacher_log_probs"),
                      ("rollout_top_p_token_ids", "rollout_top_p_token_ids"),
                      ("rollout_top_p_token_offsets", "rollout_top_p_token_offsets"),
                      ("rollout_routed_experts", "rollout_routed_experts")):
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
    where = f"{CONVERT_FLAG} {getattr(args, 'custom_convert_samples_to_train_data_path', None)!r}"
    if not isinstance(data, dict):
        raise BatchError(f"{where} returned {type(data).__name__}; expected a dict of per-sample lists")
    missing = [k for k in ("tokens", "response_lengths", "rewards", "loss_masks") if k not in data]
    if missing:
        raise BatchError(f"{where} returned a dict without {missing}")
    n = len(data["tokens"])
    if n == 0:
        raise BatchError(f"{where} returned no samples")
    for key, values in data.items():
        if key in ("tokens", "response_lengths", "rewards", "loss_masks", "raw_reward", "rollout_ids",
                   "total_lengths", "rollout_mask_sums", *PER_TOKEN_KEYS) and len(values) != n:
            raise BatchError(f"{where}: {key!r} has {len(values)} entries, 'tokens' has {n}")
    for i in range(n):
        rl, nt = data["response_lengths"][i], len(data["tokens"][i])
        if rl < 0 or rl > nt:
            raise BatchError(f"{where}: entry {i}: response_length {rl} but {nt} tokens")
        for key in PER_TOKEN_KEYS:
            if key in data and data[key][i] is not None and len(data[key][i]) != rl:
                raise BatchError(f"{where}: entry {i}: {key} has {len(data[key][i])} entries, "
                                 f"response_length is {rl}")
    out = dict(data)
    out.setdefault("total_lengths", [len(t) for t in data["tokens"]])
    if "rollout_ids" not in out:
        own = [getattr(s, "rollout_id", None) for s in samples] if len(samples) == n else [None] * n
        out["rollout_ids"] = assign_rollout_ids(own)
    out.setdefault("rollout_mask_sums", rollout_mask_sums(out["rollout_ids"], out["loss_masks"]))
    out.setdefault("raw_reward", list(out["rewards"]))
    return out
