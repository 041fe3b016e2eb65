"""What a dynamic sampling filter returns, and how the rollout loop reads it.

`keep_when_insufficient`: a group the filter rejects is still kept when dropping it would leave
fewer groups (kept plus still generating, this one included) than the batch needs, so a nearly
full batch is completed without starting another round of over-sampling.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class DynamicFilterOutput:
    keep: bool
    reason: str | None = None  # why it was dropped; counted in metrics as rollout/dynamic_filter/drop_<reason>
    keep_when_insufficient: bool = False


def should_drop_dynamic_filter_output(
    output: DynamicFilterOutput, *, remaining_batch_size: int, target_data_size: int
) -> bool:
    """Drop the group? `remaining_batch_size`: groups kept or still generating, this one included;
    `target_data_size`: groups the batch needs (`--rollout-batch-size`)."""
    if output.keep:
        return False
    return not (output.keep_when_insufficient and remaining_batch_size <= target_data_size)


def call_dynamic_filter(fn: Callable[..., Any] | None, *args: Any, **kwargs: Any) -> DynamicFilterOutput:
    """Run a filter (None keeps everything); a plain bool return (older filters) is wrapped."""
    if fn is None:
        return DynamicFilterOutput(keep=True)
    out = fn(*args, **kwargs)
    if isinstance(out, DynamicFilterOutput):
        out.keep = bool(out.keep)  # filters may return numpy/torch booleans
        return out
    if out is None:
        raise TypeError(
            f"dynamic sampling filter {getattr(fn, '__qualname__', fn)!r} returned {out!r}: "
            "expected DynamicFilterOutput or bool"
        )
    keep = bool(out)
    return DynamicFilterOutput(keep=keep, reason=None if keep else "filtered")


def apply_filter(fn: Callable[..., Any], args: Any, group: list) -> DynamicFilterOutput:
    """`call_dynamic_filter(fn, args, group)`: one group through the filter, as a DynamicFilterOutput."""
    return call_dynamic_filter(fn, args, group)


class MetricGatherer:
    """Counts dropped groups by reason for one rollout; `collect()` gives slime's metric names."""

    def __init__(self) -> None:
        self._drops: Counter[str] = Counter()

    def on_dynamic_filter_drop(self, reason: str | None) -> None:
        if reason:
            self._drops[reason] += 1

    def collect(self) -> dict[str, int]:
        return {f"rollout/dynamic_filter/drop_{reason}": n for reason, n in self._drops.items()}
