"""One calling convention for any interaction object written to verl's `BaseInteraction` shape.

Methods may be sync or async; `finalize_interaction` is called with the instance id when it takes
one (verl's Gsm8kInteraction) and without when it takes none (verl's base class). What
`generate_response` returns is checked, so a wrong shape is an error naming the class, not a
crash three frames later.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
from dataclasses import dataclass, field
from typing import Any

INTERACTION_METHODS = ("start_interaction", "generate_response", "finalize_interaction")


class InteractionError(RuntimeError):
    """An interaction answered outside verl's contract; the message names it and what was wrong."""


@dataclass(frozen=True)
class UserReply:
    """What the simulated user said after one assistant turn."""

    terminate: bool
    content: str
    score: float | None
    metrics: dict[str, Any] = field(default_factory=dict)


def is_interaction_class(obj: Any) -> bool:
    return isinstance(obj, type) and all(callable(getattr(obj, m, None)) for m in INTERACTION_METHODS)


def _plain(metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics as JSON builtins (they are stored on the sample, which must load with
    `torch.load(weights_only=True)`): numpy scalars and arrays become numbers and lists, anything
    else its `str`."""

    def builtin(value: Any) -> Any:
        return value.tolist() if hasattr(value, "tolist") else str(value)

    return json.loads(json.dumps(metrics, default=builtin))


def _is_bool(value: Any) -> bool:
    """A Python bool, or numpy's (what `score > 0.5` gives when the score is a numpy number)."""
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))


def _takes_an_argument(fn: Any) -> bool:
    """Whether `fn` (bound) accepts a positional argument: verl's base finalize takes none."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)


class InteractionAdapter:
    """The interaction `inner` of config entry `name` (class `class_name`), as the loop calls it.

    `timeout` (--interaction-timeout): seconds each awaited call may take; one that never returned
    hung its rollout (170 s observed, --tool-call-timeout does not apply). A method that blocks
    without awaiting holds the event loop itself and cannot be bounded from it."""

    def __init__(self, inner: Any, name: str, class_name: str, timeout: float | None = None):
        self.inner, self.name, self.class_name, self.timeout = inner, name, class_name, timeout
        self._finalize_takes_id = _takes_an_argument(inner.finalize_interaction)
        self.timeouts = 0  # calls that did not return within `timeout`

    def _who(self, method: str) -> str:
        return f"interaction {self.name!r} ({self.class_name}).{method}()"

    async def _bounded(self, value: Any, method: str) -> Any:
        """`value` resolved, within `timeout` seconds; InteractionError naming the method and the flag."""
        if not inspect.isawaitable(value):
            return value
        if self.timeout is None:
            return await value
        try:
            return await asyncio.wait_for(value, self.timeout)
        except asyncio.TimeoutError:
            self.timeouts += 1
            raise InteractionError(
                f"{self._who(method)} did not return within {self.timeout:g} s (--interaction-timeout)"
            ) from None

    async def start(self, instance_id: str, interaction_kwargs: dict[str, Any]) -> None:
        """verl passes the row's interaction_kwargs (its `name` too) and keeps its own request id."""
        await self._bounded(self.inner.start_interaction(instance_id, **interaction_kwargs), "start_interaction")

    async def respond(
        self, instance_id: str, messages: list[dict[str, Any]], interaction_kwargs: dict[str, Any]
    ) -> UserReply:
        got = await self._bounded(
            self.inner.generate_response(instance_id, messages, **interaction_kwargs), "generate_response"
        )
        return self._reply(got)

    async def finalize(self, instance_id: str) -> None:
        fn = self.inner.finalize_interaction
        await self._bounded(fn(instance_id) if self._finalize_takes_id else fn(), "finalize_interaction")

    def _reply(self, got: Any) -> UserReply:
        who = self._who("generate_response")
        if not isinstance(got, (tuple, list)) or len(got) != 4:
            raise InteractionError(
                f"{who} returned {type(got).__name__} {got!r:.80}; expected "
                f"(should_terminate_sequence, response_content, score, metrics)"
            )
        terminate, content, score, metrics = got
        if not _is_bool(terminate):
            raise InteractionError(f"{who}: should_terminate_sequence must be a bool, got {type(terminate).__name__}")
        if not isinstance(content, str):
            raise InteractionError(f"{who}: response_content must be a str, got {type(content).__name__}")
        if score is not None and (
            isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score)
        ):
            raise InteractionError(f"{who}: the score must be a finite number or None, got {score!r:.40}")
        if metrics is not None and not isinstance(metrics, dict):
            raise InteractionError(f"{who}: metrics must be a dict or None, got {type(metrics).__name__}")
        return UserReply(bool(terminate), content, None if score is None else float(score), _plain(metrics or {}))
