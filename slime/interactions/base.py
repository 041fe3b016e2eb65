"""verl's interaction contract: a simulated user that answers the model's turns.

A class with verl's `BaseInteraction` methods (async or sync) runs here unchanged: one object per
config entry, shared by every trajectory, its per-trajectory state kept under `instance_id`.
Lifecycle per trajectory: start_interaction -> generate_response* -> finalize_interaction (this
loop calls finalize on every path; verl's agent loop never does).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4


class BaseInteraction:
    """Same constructor, methods and return shapes as `verl.interactions.base.BaseInteraction`."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.name: str = config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """Begin one trajectory's conversation; `kwargs` are the row's `interaction_kwargs`."""
        return instance_id if instance_id is not None else str(uuid4())

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        """(should_terminate_sequence, the user's reply, this turn's score, metrics)."""
        return False, "Your current result seems acceptable.", 0.8, {}

    async def calculate_score(self, *args: Any, **kwargs: Any) -> float:
        return 0.0

    async def finalize_interaction(self, *args: Any, **kwargs: Any) -> None:
        """Release what `start_interaction` kept for the trajectory."""
