"""The engine's sampling parameters from the flags, and the per-sample seeds of a group.

`sampling_params_from_args` is what every default rollout sends (train, or eval with `--eval-*`);
`group_sampling_params` gives each sample of a group its own copy, seeded by position under
`--sglang-enable-deterministic-inference`.
"""

from __future__ import annotations

from typing import Any


def sampling_params_from_args(args: Any, evaluation: bool = False) -> dict[str, Any]:
    params = {
        "temperature": args.eval_temperature
        if evaluation and args.eval_temperature is not None
        else args.rollout_temperature,
        "top_p": args.eval_top_p if evaluation and args.eval_top_p is not None else args.rollout_top_p,
        "top_k": args.rollout_top_k,
        "max_new_tokens": args.eval_max_response_len if evaluation else args.rollout_max_response_len,
        "skip_special_tokens": bool(args.rollout_skip_special_tokens),
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
    if args.rollout_stop:
        params["stop"] = list(args.rollout_stop)
    if args.rollout_stop_token_ids:
        params["stop_token_ids"] = list(args.rollout_stop_token_ids)
    return params


def group_sampling_params(args: Any, sampling_params: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """slime's `--sglang-enable-deterministic-inference`: the i-th sample of every group is sampled
    with `sampling_seed = --rollout-seed + i` (the same seeds in every group and in eval), so a run
    repeats its samples; otherwise every sample shares the flags' parameters."""
    if not getattr(args, "sglang_enable_deterministic_inference", False):
        return [sampling_params] * n
    seed = int(args.rollout_seed or 0)
    return [{**sampling_params, "sampling_seed": seed + i} for i in range(n)]
