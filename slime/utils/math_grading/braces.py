"""Balanced-brace scanning shared by the math graders (`\\boxed{...}`, LaTeX macro arguments)."""

from __future__ import annotations


def closing_brace(s: str, start: int) -> int | None:
    """Index of the `}` that brings the brace depth, counted from s[start], back to zero; None if none does."""
    depth = 0
    for i in range(start, len(s)):
        if s[i] == "{":
            depth += 1
        elif s[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def last_boxed(s: str, *markers: str) -> str | None:
    """The last `marker{...}` with balanced braces, wrapper included, trying `markers` in order; None if none."""
    for marker in markers:
        start = s.rfind(marker)
        if start >= 0:
            end = closing_brace(s, start)
            return None if end is None else s[start : end + 1]
    return None
