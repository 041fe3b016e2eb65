"""Dynamic sampling filters (`--dynamic-sampling-filter-path`): decide per group whether it is
kept for training, e.g. DAPO's "drop groups whose rewards are all equal"."""

from __future__ import annotations

from typing import Any

from slime.rollout.base_types import DynamicFilterOutput
from slime.utils.types import Sample


def check_reward_nonzero_std(args: Any, samples: list[Sample], **kwargs: Any) -> DynamicFilterOutput:
    rewards = [s.get_reward_value(args) for s in samples]
    keep = max(rewards) > min(rewards)
    return DynamicFilterOutput(keep=keep, reason=None if keep else "zero_std")


def apply_filter(fn: Any, args: Any, group: list[Sample]) -> DynamicFilterOutput:
    """Call a filter; accept slime's older bool return as well as DynamicFilterOutput."""
    out = fn(args, group)
    if isinstance(out, DynamicFilterOutput):
        return out
    return DynamicFilterOutput(keep=bool(out), reason=None if out else "filtered")
