"""Token F1 of a short answer (`--rm-type f1`, SQuAD/HotpotQA style): lowercase, no punctuation,
no articles; a yes/no/noanswer mismatch scores 0."""

from __future__ import annotations

import re
import string
from collections import Counter

_PUNCT = str.maketrans("", "", string.punctuation)
_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(s: str) -> str:
    s = s.lower().translate(_PUNCT)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_score(prediction: str | None, ground_truth: str) -> tuple[float, float, float]:
    """(f1, precision, recall); (0, 0, 0) when nothing overlaps."""
    zero = (0, 0, 0)
    if prediction is None:
        return zero
    pred, truth = normalize_answer(prediction), normalize_answer(ground_truth)
    if (pred in _SPECIAL or truth in _SPECIAL) and pred != truth:
        return zero
    pred_tokens, truth_tokens = pred.split(), truth.split()
    same = sum((Counter(pred_tokens) & Counter(truth_tokens)).values())
    if same == 0:
        return zero
    precision, recall = same / len(pred_tokens), same / len(truth_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall
