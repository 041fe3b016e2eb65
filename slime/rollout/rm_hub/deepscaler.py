"""DeepScaleR's rule-based reward (`--rm-type deepscaler`): only the part after `</think>` (or
`###Response`) is graded, its boxed answer against the label; 1 or 0."""

from __future__ import annotations

from typing import Any

from slime.utils.math_grading.answers import extract_answer, grade_answer_mathd, grade_answer_sympy


def get_deepscaler_rule_based_reward(response: str, label: Any) -> int:
    if "</think>" in response:
        solution = response.split("</think>")[-1]
    elif "###Response" in response:
        solution = response.split("###Response")[1]
    else:
        return 0  # no end of reasoning: nothing is graded
    answer = extract_answer(solution)
    if answer is None or label == "":
        return 0
    if not isinstance(label, (str, int, float)):
        raise ValueError(f"--rm-type deepscaler: label must be a string or a number, got {type(label).__name__}")
    truth = str(label)
    if "\\boxed" in truth:
        truth = extract_answer(truth)
        if truth is None:
            return 0
    return 1 if grade_answer_mathd(answer, truth) or grade_answer_sympy(answer, truth) else 0
