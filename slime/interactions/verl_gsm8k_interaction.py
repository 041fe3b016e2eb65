"""verl's `Gsm8kInteraction` as verl behaves, for configs naming
`verl.interactions.gsm8k_interaction.Gsm8kInteraction` when verl is not installed: the last assistant
message's content as it is (None stays None), verl's strict gsm8k score (string equality,
`slime.utils.verl_reward_score.gsm8k.compute_score`, looked up at each call as verl does), and
finalizing an unknown instance raises KeyError. slime's own `slime.interactions.gsm8k_interaction`
keeps its tolerant behaviour under its own name.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from slime.interactions.base import BaseInteraction
from slime.utils.verl_reward_score import gsm8k

CORRECT = "Your response is correct!"
INCORRECT = "Your response is incorrect! You need to reflect on your answer and try again."


class Gsm8kInteraction(BaseInteraction):
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
        content = next((m.get("content") for m in reversed(messages) if m.get("role") == "assistant"), "")
        self._instance_dict[instance_id]["response"] = content
        reward = await self.calculate_score(instance_id)
        if reward == 1.0:
            return True, CORRECT, reward, {}
        return False, INCORRECT, reward, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        state = self._instance_dict[instance_id]
        return gsm8k.compute_score(
            state["response"], state["ground_truth"], method="strict", format_score=0.0, score=1.0
        )

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        del self._instance_dict[instance_id]
