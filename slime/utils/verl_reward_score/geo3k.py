"""verl's geo3k score: accuracy by the `mathruler` grader (the package verl grades with), optionally
on the last `\\boxed{}` only, plus a weighted format term (`<think>...</think>` then a `\\boxed{}`)."""

from __future__ import annotations

import re

from mathruler.grader import extract_boxed_content, grade_answer

_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_reward(predict_str: str) -> float:
    return 1.0 if _FORMAT.fullmatch(predict_str) else 0.0


def acc_reward(predict_str: str, ground_truth: str, use_boxed: bool = True) -> float:
    answer = extract_boxed_content(predict_str) if use_boxed else predict_str
    return 1.0 if grade_answer(answer, ground_truth) else 0.0


def compute_score(predict_str: str, ground_truth: str, use_boxed: bool = True, format_score: float = 0.1) -> float:
    return (1.0 - format_score) * acc_reward(predict_str, ground_truth, use_boxed) + format_score * format_reward(
        predict_str
    )
