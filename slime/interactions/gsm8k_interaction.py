"""slime's equivalent of verl's `Gsm8kInteraction`: the user checks the model's last answer.

A correct `#### <answer>` ends the conversation ("Your response is correct!", score 1.0); anything
else asks the model to try again (score 0.0). Scoring is verl's gsm8k `strict` rule: the last
`#### <number>` in the final 300 characters, commas and `$` removed, compared as text with the
ground truth.
"""

from __future__ import annotations

import re
from typing import Any
from uuid import uuid4

from slime.interactions.base import BaseInteraction

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
CLIP_CHARS = 300  # verl scores only the end of the answer, where the final answer is
CORRECT = "Your response is correct!"
INCORRECT = "Your response is incorrect! You need to reflect on your answer and try again."


def strict_gsm8k_score(text: str, ground_truth: Any) -> float:
    """1.0 when the last `#### n` of `text` is the ground truth, else 0.0 (verl's strict method)."""
    found = _STRICT.findall(text[-CLIP_CHARS:])
    if not found:
        return 0.0
    return 1.0 if found[-1].replace(",", "").replace("$", "") == str(ground_truth) else 0.0


class Gsm8kInteraction(BaseInteraction):
    """Per trajectory: the ground truth (from interaction_kwargs) and the last answer scored."""

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        self._instance_dict: dict[str, dict[str, Any]] = {}

    async def start_interaction(
        self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs: Any
    ) -> str:
        instance_id = instance_id if instance_id is not None else str(uuid4())
        self._instance_dict[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        last = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        state = self._instance_dict[instance_id]
        state["response"] = last
        state["reward"] = await self.calculate_score(instance_id)
        if state["reward"] == 1.0:
            return True, CORRECT, 1.0, {}
        return False, INCORRECT, state["reward"], {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        state = self._instance_dict[instance_id]
        return strict_gsm8k_score(state["response"], state["ground_truth"])

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self._instance_dict.pop(instance_id, None)
