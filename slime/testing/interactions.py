"""A user's interaction class, written to verl's `BaseInteraction` shape without importing any of
ours: sync and async methods mixed, `finalize_interaction` taking the id. Loaded by dotted path
(`slime.testing.interactions.ScriptedUser`) from an interaction YAML in tests."""

from __future__ import annotations

from typing import Any


class ScriptedUser:
    """Answers each assistant turn with the next of `config["replies"]` ([terminate, content, score]),
    and keeps what it was called with (per object, for the test to read)."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.name = config["name"]
        self.replies = [tuple(r) for r in config.get("replies", [])]
        self.started: dict[str, dict[str, Any]] = {}
        self.seen: list[list[dict[str, Any]]] = []  # the messages of every generate_response call
        self.finalized: list[str] = []

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        self.started[instance_id] = dict(kwargs)
        return instance_id

    def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any):
        assert instance_id in self.started and kwargs == self.started[instance_id]
        self.seen.append([dict(m) for m in messages])
        terminate, content, score = self.replies[len(self.seen) - 1]
        return terminate, content, score, {"reply": len(self.seen)}

    async def finalize_interaction(self, instance_id: str) -> None:
        self.finalized.append(instance_id)
