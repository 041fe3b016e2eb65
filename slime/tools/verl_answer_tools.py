"""verl's `Gsm8kTool` and `Geo3kTool` as verl grades them, for YAMLs that name verl's classes
(`verl.tools.gsm8k_tool.Gsm8kTool`, `verl.tools.geo3k_tool.Geo3kTool`) when verl is not installed.

Each submission replaces the trajectory's response and is scored by verl's reward score
(`slime.utils.verl_reward_score`): gsm8k prefixes `#### ` and compares strings (`flexible`), geo3k
grades the whole answer with `mathruler` (`use_boxed=False`, no format term). Step reward: 0 when
the score rose above the previous submission's, -0.05 otherwise; `calc_reward` scores the last
submission again. slime's numeric graders keep slime's names (`slime.tools.gsm8k_tool.Gsm8kTool`,
`slime.tools.geo3k_tool.Geo3kTool`).
"""

from __future__ import annotations

from typing import Any

from slime.tools.answer_tool import AnswerTool
from slime.tools.schemas import ToolResponse
from slime.utils.verl_reward_score import geo3k, gsm8k

STEP_PENALTY = -0.05  # verl's, not configurable there


class _VerlAnswerTool(AnswerTool):
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        answer = parameters.get("answer", "")
        if not isinstance(answer, str):
            answer = str(answer)
        state = self._state[instance_id]
        state["response"] = self._response(answer)
        state["answers"].append(answer)
        reward = await self.calc_reward(instance_id)
        step = 0.0 if reward > state["reward"] else STEP_PENALTY
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed {answer=} {reward=}"), step, {}

    def _response(self, answer: str) -> str:
        return answer

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        state = self._state[instance_id]
        return self._score(state.get("response", ""), state["ground_truth"])

    def _score(self, response: str, ground_truth: Any) -> float:
        raise NotImplementedError


class VerlGsm8kTool(_VerlAnswerTool):
    """verl's `calc_gsm8k_reward`: `#### <answer>`, verl's flexible extraction, string equality."""

    def _response(self, answer: str) -> str:
        return answer if answer.startswith("#### ") else "#### " + answer

    def _score(self, response: str, ground_truth: Any) -> float:
        return gsm8k.compute_score(response, ground_truth, method="flexible", format_score=0.0, score=1.0)


class VerlGeo3kTool(_VerlAnswerTool):
    """verl's `calc_geo3k_reward`: the whole answer graded by mathruler against the ground truth."""

    def _score(self, response: str, ground_truth: Any) -> float:
        return geo3k.compute_score(response, ground_truth, use_boxed=False, format_score=0.0)
