"""`calc_geo3k_reward`, verl's `Geo3kTool`: the model submits an answer to a Geometry3K problem.

Each submission is graded against the sample's ground truth (`create_kwargs`) as verl grades it
(`geo3k.compute_score(answer, truth, use_boxed=False, format_score=0.0)`: the whole answer, no
`\\boxed{}` needed, 1.0 or 0.0), with the PRM800K grader slime's math rules use (`slime.utils.math_grading`:
normalised string match, then bounded symbolic equivalence). Step reward: 0 when the score rose above the last
submission's, `penalty` (-0.05) otherwise. Final reward (`calc_reward`): the last submission's score,
not the best (verl's rule; `calc_gsm8k_reward` keeps the best).
"""

from __future__ import annotations

import asyncio
from typing import Any

from slime.tools.answer_tool import AnswerTool
from slime.tools.schemas import ToolResponse
from slime.utils.math_grading.answers import grade_answer_mathd, grade_answer_sympy


def geo3k_score(answer: str, ground_truth: Any) -> float:
    """1.0 when `answer` equals the ground truth after normalisation or symbolically, else 0.0."""
    if ground_truth is None or not answer:
        return 0.0
    truth = str(ground_truth)
    return 1.0 if grade_answer_mathd(answer, truth) or grade_answer_sympy(answer, truth) else 0.0


class Geo3kTool(AnswerTool):
    """config: `penalty` (see `AnswerTool`)."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        """Graded in a worker thread: the symbolic check may take a while and the loop serves other turns."""
        state = self._state[instance_id]
        answer = str(parameters.get("answer", ""))
        score = await asyncio.to_thread(geo3k_score, answer, state["ground_truth"])
        step = 0.0 if score > state["reward"] else self.penalty
        state["reward"] = score
        state["answers"].append(answer)
        return ToolResponse(text=f"Current parsed answer={answer!r} reward={score}"), step, {"score": score}
