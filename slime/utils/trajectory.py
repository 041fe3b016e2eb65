"""The typed record of one multi-turn sample: turns, spans, tool messages, errors, rewards.

Why one type: the tool loop writes it, and metrics, rollout dumps and the viewer read it through
the same class, so writer and readers cannot disagree on a field's shape (errors are lists of
records; their counts are `len()` of those lists, derived, never stored a second time).

It lives in `sample.metadata` as plain builtins (so `Sample.to_dict()` stays loadable with
`torch.load(weights_only=True)`), under the keys slime plugins and readers already use
(`turns`, `finish_reason`, `tool_calls`, `round_number`, ...). `TrajectoryRecord.of(sample)`
reads it back (None for samples no tool loop wrote), `record.store(sample)` writes it. Derived
values (`tool_calls`, `tool_reward_total`, `round_number`, `truncated_tool_responses`) are
written for outside readers but recomputed, never trusted, when read back.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field, model_validator

from slime.utils.types import Sample

VERSION_KEY = "trajectory_version"  # marks metadata written by a tool loop; bump on incompatible change
TRAJECTORY_VERSION = 1


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TurnSpan(_Record):
    """Half-open `[start, end)` response-token offsets of one turn."""

    turn: int
    role: Literal["assistant", "tool", "user"] = Field(
        description="'assistant' (sampled, trained), 'tool' or 'user' (an interaction's reply; both masked)"
    )
    start: int
    end: int


class ToolMessage(_Record):
    """One tool call (or malformed call) the model emitted, and the answer it was given."""

    turn: int
    name: str | None = Field(None, description="the tool called; None for a call that could not be parsed")
    arguments: Any = None
    response: str | None = Field(None, description="the tool message shown to the model; None if never answered")
    error: str | None = None
    executed: bool = Field(False, description="the tool ran (successfully or not)")
    truncated: bool = Field(False, description="the response was cut to --max-tool-response-tokens")


class ToolErrorRecord(_Record):
    """A call that failed or was refused; `turn` is None for create/release/calc_reward failures."""

    turn: int | None
    tool: str
    kind: str = Field(
        description="unknown_tool, invalid_arguments, too_many_calls, timeout, exception, "
        "not_executed, release, calc_reward"
    )
    message: str


class ParseErrorRecord(_Record):
    """Model output that looked like a tool call but could not be read as one."""

    turn: int
    kind: str = Field(description="malformed_json, bad_call, cut_off, unclosed, unmatched_close")
    message: str
    raw: str


class StepReward(_Record):
    turn: int
    tool: str
    reward: float


class UserTurn(_Record):
    """What the sample's interaction (verl's simulated user) said after assistant turn `turn`."""

    turn: int
    content: str
    score: float | None = Field(None, description="the interaction's score of the assistant turn (verl's turn score)")
    terminate: bool = Field(description="the interaction ended the conversation")
    metrics: dict[str, Any] = Field(default_factory=dict)
    appended: bool = Field(
        description="its tokens were added to the trajectory (not on terminate, nor when they did not fit the budget)"
    )


class TrajectoryRecord(_Record):
    """Everything the tool loop records about one sample besides its tokens."""

    turns: int = Field(0, description="assistant turns generated")
    finish_reason: str = ""
    turn_spans: list[TurnSpan] = Field(default_factory=list)
    tool_messages: list[ToolMessage] = Field(default_factory=list)
    tool_errors: list[ToolErrorRecord] = Field(default_factory=list)
    parse_errors: list[ParseErrorRecord] = Field(default_factory=list)
    step_rewards: list[StepReward] = Field(default_factory=list)
    tool_rewards: dict[str, float] = Field(default_factory=dict, description="final calc_reward per tool")
    tool_create_responses: dict[str, str] = Field(default_factory=dict)
    template_drift: bool | None = Field(None, description="re-rendering would differ; None: not checked")
    template_drift_detail: str | None = None
    non_generation_time: float = Field(0.0, description="seconds spent running tools")
    turn_overhead_s: list[float] = Field(default_factory=list, description="loop time per tool turn")
    dropped_tool_tokens: int | None = Field(None, description="tool-turn tokens that did not fit the budget")
    error: str | None = None
    outcome_reward: Any = Field(None, description="the RM's reward before tool rewards were added")
    interaction: str | None = Field(
        None, description="the name of the sample's interaction (--interaction-config-path)"
    )
    user_turns: list[UserTurn] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _ignore_derived(cls, data: Any) -> Any:
        """Derived values are written for outside readers; reading back recomputes them."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k not in cls.model_computed_fields}
        return data

    @computed_field
    @property
    def tool_calls(self) -> dict[str, int]:
        """Executed calls per tool."""
        return dict(Counter(m.name for m in self.tool_messages if m.executed and m.name is not None))

    @computed_field
    @property
    def tool_reward_total(self) -> float:
        return sum(r.reward for r in self.step_rewards) + sum(self.tool_rewards.values())

    @computed_field
    @property
    def turn_scores(self) -> list[float]:
        """verl's `turn_scores`: the interaction's score of each assistant turn it answered (None skipped, as verl)."""
        return [u.score for u in self.user_turns if u.score is not None]

    @computed_field
    @property
    def round_number(self) -> int:
        """slime's name for the number of assistant turns (copied into the batch by the controller's conversion)."""
        return self.turns

    @computed_field
    @property
    def truncated_tool_responses(self) -> int:
        return sum(m.truncated for m in self.tool_messages)

    # ---- sample.metadata <-> record ---------------------------------------------------------
    @classmethod
    def keys(cls) -> set[str]:
        """Every metadata key a stored record owns."""
        return {*cls.model_fields, *cls.model_computed_fields, VERSION_KEY}

    @classmethod
    def of(cls, sample: Sample) -> TrajectoryRecord | None:
        """The record stored on `sample`, or None when no tool loop wrote one.

        Raises ValueError naming the sample and field when the stored metadata does not match this type.
        """
        meta = sample.metadata or {}
        version = meta.get(VERSION_KEY)
        if version is None:
            return None
        if version != TRAJECTORY_VERSION:
            raise ValueError(
                f"sample {sample.index}: metadata[{VERSION_KEY!r}] is {version!r}, this reader "
                f"understands version {TRAJECTORY_VERSION}"
            )
        try:
            return cls.model_validate({k: meta[k] for k in cls.model_fields if k in meta})
        except ValidationError as e:
            raise ValueError(f"sample {sample.index}: metadata does not hold a valid trajectory record: {e}") from e

    def store(self, sample: Sample) -> None:
        """Write this record into `sample.metadata` as builtins, replacing any earlier record.

        Unset optional fields (None) are left out, so `"error" in metadata` means there was one.
        """
        meta = sample.metadata
        for key in self.keys():
            meta.pop(key, None)
        meta.update({k: v for k, v in self.model_dump(mode="python").items() if v is not None})
        meta[VERSION_KEY] = TRAJECTORY_VERSION

    @classmethod
    def clear(cls, sample: Sample) -> None:
        """Remove a stored record (a recycled sample starts its trajectory again)."""
        for key in cls.keys():
            sample.metadata.pop(key, None)
