"""`SampleBuilder`: one root-to-leaf chain of turns -> the token rows of one `Sample`.

Turns are appended in order. A turn whose prompt exactly extends the held tokens adds only its
prompt tail (mask 0) and then the ids the engine sampled (mask 1, their log-probs and weight
version) -- CLEAN. A short divergence inside the latest response is healed by re-supplying that
span from the prompt with mask 0 -- REALIGN. Anything else cannot extend this row -- FORK: the
caller closes this builder and opens a new one. Tokenizer-free and HTTP-free.

REALIGN over a response this row trains drops sampled ids from training (slime's way, kept for
its adapters: the row names them in `dropped_turns`). With `absorb_sampled=False` (the gateway's)
a realignment may only absorb what this row does not train, so it forks there instead and every
sampled id stays trained in exactly one row.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from slime.agent.gateway.records import TurnRecord
from slime.utils.prompt_images import train_inputs, whole_images
from slime.utils.types import Sample

# an aborted last turn stays COMPLETED: a gateway session is not continued by --partial-rollout
_FINISH_STATUS = {"length": Sample.Status.TRUNCATED}


def common_prefix_len(a: list[int], b: list[int], chunk: int = 4096) -> int:
    """Length of the longest common prefix; compares slices chunk by chunk (C speed) first."""
    limit = min(len(a), len(b))
    matched = 0
    while matched < limit:
        end = min(matched + chunk, limit)
        if a[matched:end] != b[matched:end]:
            while a[matched] == b[matched]:
                matched += 1
            return matched
        matched = end
    return matched


class DriftKind(enum.Enum):
    CLEAN = "clean"
    REALIGN = "realign"
    FORK = "fork"


@dataclasses.dataclass
class _Segment:
    """Token positions [start, end) sampled by one engine call, trained in this row."""

    start: int
    end: int
    weight_version: str | None


class SampleBuilder:
    def __init__(self, fork_threshold: int, *, absorb_sampled: bool = True) -> None:
        self.fork_threshold, self.absorb_sampled = fork_threshold, absorb_sampled
        self.tokens: list[int] = []
        self.loss_mask: list[int] = []
        self.log_probs: list[float] = []
        self.segments: list[_Segment] = []
        self.last_response_start: int | None = None
        self.prompt_length = 0  # the first turn's prompt: what the Sample calls its prompt
        self.last_turn_index: int | None = None
        self.dropped_turns: list[int] = []  # turns whose trained ids a REALIGN made context
        self.images: tuple = ()  # the last prompt's images: every image token of the row is in it

    def classify(self, turn: TurnRecord) -> DriftKind:
        """CLEAN when the prompt extends the held tokens; REALIGN when it diverges inside the latest
        response and the new response is shorter than the fork threshold; FORK otherwise."""
        at = common_prefix_len(self.tokens, turn.prompt_ids)
        if at == len(self.tokens):
            return DriftKind.CLEAN
        start = self.last_response_start
        if (
            start is not None
            and at >= start
            and len(turn.output_ids) < self.fork_threshold
            and (self.absorb_sampled or not any(self.loss_mask[start:]))
        ):
            return DriftKind.REALIGN
        return DriftKind.FORK

    def append(self, turn: TurnRecord, kind: DriftKind, *, trained: bool, turn_index: int | None = None) -> None:
        """Add `turn`'s prompt tail (mask 0) then its sampled ids (mask 1 when `trained`, else
        context a sibling branch already trains)."""
        if kind is DriftKind.FORK:
            raise ValueError("SampleBuilder.append: a FORK turn starts a new builder")
        first = self.last_response_start is None
        if kind is DriftKind.REALIGN:
            if any(self.loss_mask[self.last_response_start :]) and self.last_turn_index is not None:
                self.dropped_turns.append(self.last_turn_index)
            self._truncate(self.last_response_start)
        self.last_turn_index = turn_index
        self.images = turn.images or self.images
        self._extend(turn.prompt_ids[len(self.tokens) :], mask=0)
        self.last_response_start = len(self.tokens)
        if trained and turn.output_ids:
            self.segments.append(
                _Segment(len(self.tokens), len(self.tokens) + len(turn.output_ids), turn.weight_version)
            )
        self._extend(turn.output_ids, mask=int(trained), log_probs=turn.output_log_probs if trained else None)
        if first:
            self.prompt_length = len(turn.prompt_ids)

    def _truncate(self, at: int) -> None:
        del self.tokens[at:], self.loss_mask[at:], self.log_probs[at:]
        self.segments = [s for s in self.segments if s.end <= at]

    def _extend(self, ids: list[int], *, mask: int, log_probs: list[float] | None = None) -> None:
        self.tokens.extend(ids)
        self.loss_mask.extend([mask] * len(ids))
        # a producer without log-probs (slime's TurnRecord allows it) leaves 0.0, as slime does
        self.log_probs.extend(log_probs if log_probs else [0.0] * len(ids))

    @property
    def has_trained_response(self) -> bool:
        return any(self.loss_mask[self.prompt_length :])

    def to_sample(self, base: Sample, metadata: dict[str, Any], *, finish_reason: str, max_tokens: int = 0) -> Sample:
        """The row as a `Sample` of `base`'s prompt/label/ids: the first prompt is the prompt, the rest
        the response; each trained span one segment (weight version, rollout id)."""
        end = min(len(self.tokens), max_tokens) if max_tokens else len(self.tokens)
        end, images = whole_images(self.tokens, end, list(self.images))
        p = self.prompt_length
        rollout_id = base.rollout_id if base.rollout_id is not None else base.index
        sample = Sample(
            index=base.index,
            group_index=base.group_index,
            rollout_id=rollout_id,
            prompt=base.prompt,
            label=base.label,
            session_id=base.session_id,
            tokens=self.tokens[:end],
            response_length=max(0, end - p),
            loss_mask=self.loss_mask[p:end],
            rollout_log_probs=self.log_probs[p:end],
            status=_FINISH_STATUS.get(finish_reason, Sample.Status.COMPLETED),
            metadata={**metadata, "finish_reason": finish_reason},
        )
        if images:  # the image tokens are prompt tokens (mask 0); the trainer needs their pixels
            sample.multimodal_inputs = {"images": [image.data_uri for image in images], "videos": None}
            sample.multimodal_train_inputs = train_inputs(images)
        for seg in self.segments:
            if seg.start < end:
                sample.record_segment(seg.start - p, min(seg.end, end) - p, seg.weight_version, rollout_id)
        return sample
