"""Multiple-choice grading (`--rm-type gpqa`): the option letter the response picks against the
correct letter, from `metadata` (`choices`, `valid_letters`, `correct_letter`, `correct_answer`,
`answer_text`) or the label (a letter, an index, or the text of the right choice)."""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from typing import Any

DEFAULT_VALID_LETTERS = list(string.ascii_uppercase[:10])

_LETTER_PATTERNS = (
    r"(?:answer|option|choice)\s*(?:is|:)?\s*([A-Z])",
    r"([A-Z])\s*(?:is\s*(?:the)?\s*correct)",
    r"final\s*(?:answer|option)\s*(?:is|:)?\s*([A-Z])",
)


def _strip_chain_of_thought(text: str) -> str:
    if not text:
        return ""
    return text.rsplit("</think>", 1)[-1]


def _normalize_text(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def _extract_letter_from_response(response: str, valid_letters: Iterable[str]) -> str | None:
    """The chosen letter: "answer is X" / "X is correct" / "final answer X", else the last
    standalone capital letter that is a valid option."""
    if not response:
        return None
    text = _strip_chain_of_thought(response)
    valid = {str(v).upper() for v in valid_letters}
    for pattern in _LETTER_PATTERNS:
        m = re.search(pattern, text, flags=re.IGNORECASE)
        if m and m.group(1).upper() in valid:
            return m.group(1).upper()
    for letter in reversed(re.findall(r"\b([A-Z])\b", text)):
        if letter in valid:
            return letter
    return None


def _choices(metadata: dict) -> list | None:
    choices = metadata.get("choices")
    if isinstance(choices, dict):
        return list(choices.values())
    return list(choices) if choices is not None else None


def compute_gpqa_reward(response: str, label: Any, metadata: dict | None = None) -> float:
    if response is None:
        return 0.0
    metadata = metadata if metadata is not None else {}
    choices = _choices(metadata)
    if metadata.get("valid_letters"):
        valid = [str(v).upper() for v in metadata["valid_letters"]]
    elif choices:
        valid = list(string.ascii_uppercase[: len(choices)])
    else:
        valid = DEFAULT_VALID_LETTERS
    correct = metadata.get("correct_letter")
    correct = correct.strip().upper() if isinstance(correct, str) else None

    label_text = None
    if isinstance(label, str):
        label_text = label.strip()
        if len(label_text) == 1 and label_text.upper() in valid and not correct:
            correct = label_text.upper()
    elif isinstance(label, (int, float)) and 0 <= int(label) < len(valid):
        correct = valid[int(label)]

    if not correct and choices and label_text:
        wanted = _normalize_text(label_text)
        for i, choice in enumerate(choices):
            if _normalize_text(str(choice)) == wanted:
                correct = valid[i]
                metadata.setdefault("correct_answer", choice)
                break

    picked = _extract_letter_from_response(response, valid)
    if picked and correct:
        return 1.0 if picked == correct else 0.0

    # No letter to compare: accept a response that spells out the right answer.
    targets = []
    if correct and choices and correct in valid and valid.index(correct) < len(choices):
        targets.append(str(choices[valid.index(correct)]))
    targets += [str(metadata[k]) for k in ("correct_answer", "answer_text") if metadata.get(k)]
    if label_text:
        targets.append(label_text)
    text = _normalize_text(_strip_chain_of_thought(response))
    if any(t and t in text for t in {_normalize_text(x) for x in targets if x}):
        return 1.0
    if picked and not correct and label_text:
        return 1.0 if picked == label_text.strip().upper() else 0.0
    return 0.0
