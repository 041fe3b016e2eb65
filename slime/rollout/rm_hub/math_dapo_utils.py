"""DAPO's math reward (`--rm-type dapo`, `compute_score`): the last `Answer: ...` line of the
response, normalized Minerva-style, must equal the integer ground truth; score +1.0 / -1.0,
returned as `{"score", "acc", "pred"}` (read the scalar with `--reward-key score`).
With `strict_box_verify=True` the last `\\boxed{}` near the end must equal the label verbatim.

DAPO's answers are integers and its grading is deliberately a string match after normalization,
so this type does not use the symbolic checker (that is what `math` and `deepscaler` do).
"""

from __future__ import annotations

import re
import signal
import threading

from slime.utils.math_grading.braces import last_boxed

__all__ = [
    "last_boxed_only_string",
    "remove_boxed",
    "timeout",
    "normalize_final_answer",
    "is_correct_minerva",
    "is_correct_strict_box",
    "verify",
    "compute_score",
    "SUBSTITUTIONS",
    "REMOVED_EXPRESSIONS",
]


def last_boxed_only_string(string: str) -> str | None:
    """The last `\\boxed{...}` with balanced braces (wrapper included), or None."""
    return last_boxed(string, "\\boxed{")


class BoxError(AssertionError, ValueError):
    """Not a `\\boxed{...}` string (an AssertionError, as slime raises, and a ValueError)."""


def remove_boxed(s: str) -> str:
    """`\\boxed{x}` -> `x`; raises BoxError on anything else (unlike math_utils.remove_boxed)."""
    if not (isinstance(s, str) and s.startswith("\\boxed{") and s.endswith("}")):
        raise BoxError(f"box error: {s!r} is not '\\boxed{{...}}'")
    return s[len("\\boxed{") : -1]


class timeout:  # noqa: N801 - slime's name
    """`with timeout(seconds):` raises TimeoutError after `seconds` (SIGALRM). Kept for modules
    that import it; signals exist only in the main thread, so elsewhere it does not limit time
    (this module's own functions are linear-time string work and never need it)."""

    def __init__(self, seconds: int = 1, error_message: str = "Timeout"):
        self.seconds = seconds
        self.error_message = error_message
        self._armed = False

    def handle_timeout(self, signum, frame):
        raise TimeoutError(self.error_message)

    def __enter__(self):
        self._armed = threading.current_thread() is threading.main_thread()
        if self._armed:
            self._previous = signal.signal(signal.SIGALRM, self.handle_timeout)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
        return False


SUBSTITUTIONS = [
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
]

REMOVED_EXPRESSIONS = [
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    '"',
    "\\dots",
    "<|im_end|>",
    "<|endoftext|>",
]


def normalize_final_answer(final_answer: str) -> str:
    """Minerva's normalization: right-hand side of `=`, no units/words/`$`, `\\text{}`,
    `\\boxed{}` and `\\overline{}` unwrapped, `\\fracab` -> `\\frac{a}{b}`, `1,000` -> `1000`."""
    s = str(final_answer).split("=")[-1]
    for before, after in SUBSTITUTIONS:
        s = s.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        s = s.replace(expr, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$", s)  # keep only the first $...$ span
    for macro in ("text", "textbf", "overline"):
        s = re.sub(rf"(\\{macro}\{{)(.*?)(\}})", r"\2", s)
    s = re.sub(r"(\\boxed\{)(.*)(\})", r"\2", s)
    s = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", s)
    s = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def _integer_truth(gt: str) -> str:
    try:
        return str(int(float(gt)))
    except ValueError:
        raise ValueError(f"--rm-type dapo: the label must be an integer (DAPO's answers are), got {gt!r}") from None


def is_correct_minerva(
    solution_str: str, gt: str, gt_need_extract: bool = False, answer_pattern: str = r"(?i)Answer\s*:\s*([^\n]+)"
) -> tuple[bool, str]:
    matches = re.findall(answer_pattern, solution_str)
    pred = normalize_final_answer(matches[-1] if matches else "[INVALID]")
    if gt_need_extract:
        boxed = last_boxed_only_string(gt)
        if boxed is None:
            raise ValueError(f"--rm-type dapo: label {gt!r} has no \\boxed{{...}} to extract")
        gt = remove_boxed(boxed)
    gt = _integer_truth(normalize_final_answer(gt))
    return pred == gt, pred


def is_correct_strict_box(pred: str, gt: str, pause_tokens_index: list[int] | None = None) -> tuple[int, str | None]:
    if pause_tokens_index is not None:
        if len(pause_tokens_index) != 4:
            raise ValueError(f"pause_tokens_index must have 4 entries, got {len(pause_tokens_index)}")
        pred = pred[pause_tokens_index[-1] - 100 :]
    else:
        pred = pred[-100:]
    boxed = last_boxed_only_string(pred)
    extracted = remove_boxed(boxed) if boxed is not None else None
    return (1 if extracted == gt else -1), extracted


def verify(
    solution_str: str, answer: str, strict_box_verify: bool = False, pause_tokens_index: list[int] | None = None
) -> tuple[bool, str | None]:
    if strict_box_verify:
        correct, pred = is_correct_strict_box(solution_str, answer, pause_tokens_index)
        return correct == 1, pred
    return is_correct_minerva(solution_str, answer)


def compute_score(
    solution_str: str, ground_truth: str, strict_box_verify: bool = False, pause_tokens_index: list[int] | None = None
) -> dict:
    """`{"score": 1.0 | -1.0, "acc": bool, "pred": str}`; only the last 300 characters count."""
    correct, pred = verify(solution_str[-300:], ground_truth, strict_box_verify, pause_tokens_index)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
