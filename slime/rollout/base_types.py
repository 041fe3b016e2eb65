"""What rollout functions may return (newer slime wraps results with metrics; plain lists and
dicts from older plugins are accepted too)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slime.utils.types import Sample


@dataclass
class RolloutFnTrainOutput:
    samples: list[list[Sample]]
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutFnEvalOutput:
    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class DynamicFilterOutput:
    keep: bool
    reason: str | None = None
