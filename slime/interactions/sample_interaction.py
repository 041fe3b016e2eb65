"""The interaction one sample talks to (verl's simulated user), chosen by its interaction_kwargs' name.

Started once per trajectory, asked after each assistant turn without tool calls, finalized on every
path (also when start failed half-way). Turning its reply into tokens is the caller's business.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from slime.interactions.adapter import InteractionAdapter, UserReply
from slime.interactions.registry import InteractionSet


class SampleInteraction:
    """One sample's interaction instance: the adapter, the sample's interaction_kwargs, its instance id."""

    def __init__(self, adapter: InteractionAdapter, kwargs: dict[str, Any], sample_index: Any):
        self.adapter, self.kwargs, self.sample_index = adapter, dict(kwargs), sample_index
        self.instance_id: str | None = None  # set once start was called

    @classmethod
    def choose(
        cls, interactions: InteractionSet, kwargs: Any, sample_index: Any, has_messages: bool
    ) -> "SampleInteraction":
        """Every sample needs one when --interaction-config-path is set (as in verl), and a
        message-list prompt: an interaction reads the conversation."""
        try:
            adapter = interactions.select(kwargs)
        except ValueError as e:
            raise ValueError(f"--interaction-config-path: sample {sample_index}: {e}") from None
        if not has_messages:
            raise ValueError(
                f"--interaction-config-path: sample {sample_index}: the prompt is a rendered "
                "string; an interaction reads the conversation, so give message-list prompts"
            )
        return cls(adapter, kwargs, sample_index)

    @property
    def name(self) -> str:
        return self.adapter.name

    async def start(self) -> None:
        self.instance_id = f"{self.sample_index}-{uuid4().hex[:12]}"  # finalized even when start fails half-way
        await self.adapter.start(self.instance_id, self.kwargs)

    async def respond(self, messages: list[dict[str, Any]]) -> UserReply:
        """The user's reply to the conversation so far (a copy of each message is passed)."""
        return await self.adapter.respond(self.instance_id, [dict(m) for m in messages], self.kwargs)

    async def finalize(self) -> str | None:
        """None, or what went wrong: a failing finalize must not hide the sample's result."""
        if self.instance_id is None:
            return None
        try:
            await self.adapter.finalize(self.instance_id)
        except Exception as e:  # noqa: BLE001 - reported on the sample's record by the caller
            return f"interaction {self.name!r} finalize_interaction failed: {type(e).__name__}: {e}"
        return None
