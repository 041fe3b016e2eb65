"""verl's gsm8k score: the answer is a *string* taken from the end of the text and compared with the
ground truth as given, so "72.0" is not "72", "1,000" becomes "1000" only in the answer, and a
ground truth that is not a string never matches.

- `strict`: the last `#### <digits, dots, commas>` (optionally `-`), commas and `$` removed;
- `flexible`: the last run of `-`, digits, dots and commas that is not "" or ".", kept as written
  (commas included: "7,2" stays "7,2").

Only the last 300 characters are searched (verl's bound on the regex cost); no answer scores 0.
"""

from __future__ import annotations

import re
from typing import Any

CLIP_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")
_NOT_ANSWERS = ("", ".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer string verl reads from `solution_str`, or None."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-CLIP_CHARS:] if len(solution_str) > CLIP_CHARS else solution_str
    if method == "strict":
        found = _STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    candidates = [c for c in _FLEXIBLE.findall(tail) if c not in _NOT_ANSWERS]
    if candidates:
        return candidates[-1]
    found = _FLEXIBLE.findall(tail)
    return found[0] if found else None  # verl's loop ends on the first entry when every one is "" or "."


def compute_score(
    solution_str: str, ground_truth: Any, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """`score` when the extracted answer equals `ground_truth` (string equality), `format_score` when an
    answer was found but differs, 0 when none was found."""
    answer = extract_solution(solution_str=solution_str, method=method)
    if answer is None:
        return 0
    return score if answer == ground_truth else format_score
