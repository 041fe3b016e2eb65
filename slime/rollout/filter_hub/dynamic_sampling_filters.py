"""DAPO's dynamic sampling: keep a group only if its rewards differ (a group whose samples all
got the same reward has zero advantage and teaches nothing)."""

from __future__ import annotations

import math
from typing import Any

from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.utils.types import Sample

__all__ = ["check_reward_nonzero_std", "check_reward_nonzero_std_with_fallback"]


def check_reward_nonzero_std(args: Any, samples: list[Sample], **kwargs: Any) -> DynamicFilterOutput:
    """Keep when the sample standard deviation of the rewards (`--reward-key` for dict rewards)
    exceeds 1e-6; a dropped group's reason is `zero_std_<reward rounded to 0.1>`. A group of one
    sample has no deviation and is dropped, as in slime."""
    rewards = [s.get_reward_value(args) for s in samples]
    keep = False
    if len(rewards) > 1:
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
        keep = std > 1e-6
    reason = None if keep else (f"zero_std_{round(rewards[0], 1)}" if rewards else "zero_std_empty")
    return DynamicFilterOutput(keep=keep, reason=reason)


def check_reward_nonzero_std_with_fallback(args: Any, samples: list[Sample], **kwargs: Any) -> DynamicFilterOutput:
    """Like check_reward_nonzero_std, but a zero-std group is kept when the batch could not be
    filled otherwise (no further over-sampling round)."""
    out = check_reward_nonzero_std(args, samples, **kwargs)
    out.keep_when_insufficient = True
    return out
