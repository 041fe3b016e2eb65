"""The typed records that cross the agent package's files.

`TurnRecord` is what one engine call produced (gateway -> trajectory); `ChatRequest` is a wire
request already translated to chat-template messages (protocol -> gateway); `Reply` is the parsed
model turn a protocol renders back (gateway -> protocol). Validation only, no logic.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort", "tool_calls"]


class _Factory:
    def __repr__(self) -> str:  # (how the generated signature shows a default factory)
        return "<factory>"


_FACTORY = _Factory()


def one_step_init(cls: type) -> type:
    """A frozen dataclass whose `__init__` fills the instance's dict in one call: the generated one
    sets each field through `object.__setattr__` (the frozen class refuses its own), a call per
    field, and a turn builds a few of these records with about ten fields each. Same signature,
    defaults and default factories; the class stays frozen (assignments after `__init__` refuse)."""
    params, lines, env = [], [], {"_UNSET": _FACTORY}
    for f in dataclasses.fields(cls):
        if not f.init or f.kw_only:
            raise TypeError(f"{cls.__name__}.{f.name}: one_step_init takes positional init fields only")
        if f.default is not dataclasses.MISSING:
            env[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            env[f"_factory_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_UNSET")
            lines.append(f"    if {f.name} is _UNSET: {f.name} = _factory_{f.name}()")
        else:
            params.append(f.name)
    if hasattr(cls, "__post_init__") or "__slots__" in cls.__dict__:
        raise TypeError(f"{cls.__name__}: one_step_init takes no __post_init__ and no slots")
    names = [f.name for f in dataclasses.fields(cls)]
    lines.append(f"    self.__dict__.update({', '.join(f'{n}={n}' for n in names)})")
    exec(f"def __init__(self, {', '.join(params)}):\n" + "\n".join(lines), env)  # noqa: S102 - field names only
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init
    return cls


@one_step_init
@dataclasses.dataclass(frozen=True)
class TurnRecord:
    """One `/generate` answer: the prompt ids sent, exactly the ids the engine sampled, their
    log-probs (empty when the producer had none), the weight version that sampled them, and the
    client's stop string the engine matched (its ids stay in `output_ids`: they were sampled)."""

    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str
    output_log_probs: list[float] = dataclasses.field(default_factory=list)
    ill_formed: bool = False
    weight_version: str | None = None
    stop_matched: str | None = None
    top_log_probs: list[list[tuple[float, int]]] = dataclasses.field(default_factory=list)  # when asked
    # the prompt's images in placeholder order (`PreparedImage`s), sent as `image_data`
    images: tuple[Any, ...] = dataclasses.field(default=(), compare=False, repr=False)


class TurnRecordError(AssertionError):
    """A `TurnRecord` whose lists do not line up (an AssertionError, as slime raises)."""


def check_turn(turn: TurnRecord) -> None:
    if turn.output_log_probs and len(turn.output_log_probs) != len(turn.output_ids):
        raise TurnRecordError(
            f"turn.output_log_probs length {len(turn.output_log_probs)} != "
            f"turn.output_ids length {len(turn.output_ids)}"
        )


@one_step_init
@dataclasses.dataclass(frozen=True)
class ToolUse:
    """One tool call the model made, arguments already decoded from JSON."""

    name: str
    arguments: Any


@dataclasses.dataclass(frozen=True)
class ToolChoice:
    """Which calls the client allows, whatever its API's spelling: `auto` (the model decides), `none`
    (no call), `required` (some call), or the tool `name`d; `parallel` False: at most one call."""

    mode: Literal["auto", "none", "required"] = "auto"
    name: str | None = None
    parallel: bool = True


@one_step_init
@dataclasses.dataclass(frozen=True)
class Known:
    """What a protocol made of the first `count` elements of a body's history array (`messages`, or
    Responses' `input`): all checked, translated into `messages`, so a body of the same session that
    repeats them byte for byte (`protocols.body_prefix`) checks and translates only what follows."""

    count: int
    messages: list[dict[str, Any]]


@one_step_init
@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A wire request in chat-template terms: messages as the template takes them, tools in the
    OpenAI function schema (None under `tool_choice` none: not offered), sampling keys the client
    set, whether it wants SSE, and which tool calls it allows."""

    session_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    sampling: dict[str, Any] = dataclasses.field(default_factory=dict)
    stream: bool = False
    model: str = "slime-actor"
    tool_choice: ToolChoice = ToolChoice()
    logprobs: bool = False  # the client asked for the sampled tokens' log-probs
    top_logprobs: int = 0  # and for the k most likely tokens at each position
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    known: Known | None = dataclasses.field(default=None, compare=False, repr=False)  # for the next body


@one_step_init
@dataclasses.dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    """One sampled token as the APIs show it: its text, the engine's log-prob for it, and (when
    asked) the engine's k most likely tokens there as (text, log-prob), best first."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@one_step_init
@dataclasses.dataclass(frozen=True)
class Reply:
    """The model's turn, parsed: visible text, reasoning, tool calls, why it ended, token counts.
    `message` is the chat message recorded in the session tree (the form a client echoes back);
    `stop_sequence` the client's stop string that ended it (cut from `text`, as the APIs do)."""

    text: str
    tool_uses: list[ToolUse]
    finish_reason: FinishReason
    usage: Usage
    reasoning: str = ""
    message: dict[str, Any] = dataclasses.field(default_factory=dict)
    stop_sequence: str | None = None
    logprobs: list[TokenLogprob] | None = None  # when asked: every sampled token but the closing special ones
