"""An answer checker in the style of verl's `calc_gsm8k_reward`.

The model submits an answer as often as it likes; each submission is scored against the
sample's ground truth (given once per trajectory via `create_kwargs`). Step reward: 0 when the
score improved, a small penalty otherwise, so resubmitting the same answer is discouraged. Final
reward (`calc_reward`): the best score reached.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from slime.tools.answer_tool import AnswerTool
from slime.tools.schemas import ToolResponse

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def extract_number(text: Any) -> Decimal | None:
    """The number after the last `####`, or else the last number in the text ($ and commas ignored)."""
    if text is None:
        return None
    text = str(text)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    found = _NUMBER.findall(text.replace("$", ""))
    if not found:
        return None
    try:
        return Decimal(found[-1].replace(",", "").rstrip("."))
    except InvalidOperation:
        return None


def gsm8k_score(answer: Any, ground_truth: Any) -> float:
    a, g = extract_number(answer), extract_number(ground_truth)
    return 1.0 if a is not None and g is not None and a == g else 0.0


class Gsm8kTool(AnswerTool):
    """config: `penalty` (see `AnswerTool`)."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        state = self._state[instance_id]
        answer = str(parameters.get("answer", ""))
        score = gsm8k_score(answer, state["ground_truth"])
        step = 0.0 if score > state["reward"] else self.penalty
        state["reward"] = max(state["reward"], score)
        state["answers"].append(answer)
        return ToolResponse(text=f"Current parsed answer={answer!r} reward={score}"), step, {"score": score}
