"""What rollout functions return (newer slime wraps results with metrics; plain lists and
dicts from older plugins are accepted too). `DynamicFilterOutput` lives in
`slime.rollout.filter_hub.base_types`, as in slime; it is re-exported here for older imports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.utils.types import Sample

__all__ = ["RolloutFnTrainOutput", "RolloutFnEvalOutput", "DynamicFilterOutput", "call_rollout_fn"]

# the group step the default train and eval loops are handed: slime's
# `generate_and_rm_group(args, group, sampling_params, evaluation=False) -> list[Sample]`
GroupStep = Callable[..., Awaitable[list[Sample]]]


@dataclass
class RolloutFnTrainOutput:
    samples: list[list[Sample]]
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutFnEvalOutput:
    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] = field(default_factory=dict)


def call_rollout_fn(fn: Callable[..., Any], *args: Any, evaluation: bool, **kwargs: Any):
    """Call a rollout function with `evaluation=`; wrap an older plugin's bare list (train) or
    dict (eval) in RolloutFnTrainOutput / RolloutFnEvalOutput (slime's helper)."""
    out = fn(*args, **kwargs, evaluation=evaluation)
    if isinstance(out, (RolloutFnTrainOutput, RolloutFnEvalOutput)):
        return out
    return RolloutFnEvalOutput(data=out) if evaluation else RolloutFnTrainOutput(samples=out)
