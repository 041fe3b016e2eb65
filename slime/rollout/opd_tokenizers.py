"""On-policy distillation needs the teacher to read the student's token ids as the same tokens: its
log-probs are looked up by id. `tokenizer_difference` compares the two tokenizers (every vocabulary
entry, the special tokens and their ids); `check_teacher_tokenizer` asks the teacher at `--rm-url` for
its tokenizer (`/get_model_info`, SGLang's) and refuses a different one before anything starts.

Why not the sizes: a teacher whose vocabulary merely covers the student's ids was accepted, and its
log-probs were those of tokens that mean something else to it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 10.0


class TokenizerMismatch(ValueError):
    """The teacher reads the student's ids as other tokens; the message says where they differ."""


def _specials(tok: Any) -> dict[str, Any]:
    named = {name: getattr(tok, f"{name}_token_id", None) for name in ("bos", "eos", "pad", "unk")}
    return {**named, "special tokens": sorted((t, tok.convert_tokens_to_ids(t)) for t in tok.all_special_tokens)}


def tokenizer_difference(student: Any, teacher: Any) -> str | None:
    """Where two tokenizers differ (None: same vocabulary, ids and special tokens)."""
    sv, tv = student.get_vocab(), teacher.get_vocab()
    for token, i in sorted(sv.items(), key=lambda kv: kv[1]):
        if tv.get(token) != i:
            other = next((t for t, j in tv.items() if j == i), None)
            return (
                f"the student's token {token!r} is id {i}, the teacher's is "
                f"{'absent' if token not in tv else f'id {tv[token]}'} (id {i} is {other!r} to the teacher)"
            )
    if len(tv) != len(sv):
        return f"the teacher's vocabulary has {len(tv)} entries, the student's {len(sv)}"
    ss, ts = _specials(student), _specials(teacher)
    for key in ss:
        if ss[key] != ts[key]:
            return f"{key}: student {ss[key]!r:.200}, teacher {ts[key]!r:.200}"
    return None


def teacher_model_info(rm_url: str) -> dict[str, Any] | None:
    """The teacher's `/get_model_info` (None: it does not answer it; the rollout's requests say more)."""
    import requests

    base = rm_url.rstrip("/")
    base = base[: -len("/generate")] if base.endswith("/generate") else base
    try:
        answer = requests.get(f"{base}/get_model_info", timeout=PROBE_TIMEOUT_S)
        answer.raise_for_status()
        info = answer.json()
    except (requests.RequestException, ValueError) as e:
        logger.warning(
            "--rm-url %s: the teacher's /get_model_info did not answer (%s); its tokenizer is not "
            "compared with the student's",
            rm_url,
            e,
        )
        return None
    return info if isinstance(info, dict) else None


def check_teacher_tokenizer(rm_url: str, student_path: str) -> None:
    """Refuse a teacher whose tokenizer (a local directory it names) differs from the student's."""
    info = teacher_model_info(rm_url)
    if info is None:
        return
    path = info.get("tokenizer_path") or info.get("model_path")
    if not isinstance(path, str) or not Path(path).is_dir():
        logger.warning(
            "--rm-url %s: the teacher's tokenizer %r is not a local directory; it is not compared with the student's",
            rm_url,
            path,
        )
        return
    if Path(path).resolve() == Path(student_path).resolve():
        return
    from slime.utils.processing_utils import load_tokenizer

    difference = tokenizer_difference(load_tokenizer(student_path), load_tokenizer(path))
    if difference:
        raise TokenizerMismatch(
            f"--rm-url {rm_url}: the teacher's tokenizer ({path}) is not the student's "
            f"({student_path}): {difference}; its log-probs would be of other tokens"
        )
