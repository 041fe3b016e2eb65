"""One `/generate` answer, checked against SGLang's shape before a single token is used.

An engine is another process: its answer may be cut, an HTML error page, a list, or a well-formed
object with impossible numbers (a NaN or positive log-prob, an id outside the vocabulary, more
tokens than asked for, log-probs not aligned with the ids). Any of these is a fault of that engine,
like a 5xx: `parse_generate_answer` raises `BadAnswer` (reason `engine_bad_answer:<field>`), the
HTTP layer retries it with a fresh `rid`, and a sample whose budget is spent is FAILED with the
field and an excerpt. Nothing is repaired: no default log-prob, no clamping, no dropped id.
"""

from __future__ import annotations

import json
import math
import operator
import reprlib
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from slime.utils.http_retry import AnswerError

FinishType = Literal["stop", "length", "abort"]
FINISH_TYPES: frozenset[str] = frozenset(get_args(FinishType))

# A log-prob is log(p) <= 0. Engines compute it in float32 (log_softmax) and round-trip it through
# JSON; an exact-argmax token can come out a few ulps above 0. Up to this much above 0 is accepted
# and kept exactly as sent (it is rounding, not a second probability); anything larger is a bad answer.
LOGPROB_TOLERANCE = 1e-4
EXCERPT_CHARS = 200  # of the offending value or body, in the error message


@dataclass
class EngineOutput:
    token_ids: list[int]
    log_probs: list[float]
    text: str
    finish_type: FinishType
    matched: Any = None
    weight_version: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    # asked for with `top_logprobs_num`: per sampled position, the k most likely (log-prob, id), best first
    top_log_probs: list[list[tuple[float, int]]] = field(default_factory=list)


class BadAnswer(AnswerError):
    """An answer that breaks SGLang's shape; `field` names the part that is wrong."""

    def __init__(self, field: str, problem: str, excerpt: Any = None):
        self.field = field
        shown = "" if excerpt is None else f": {_excerpt(excerpt)}"
        super().__init__(f"bad engine answer ({field}): {problem}{shown}", reason=f"engine_bad_answer:{field}")


_SHORT = reprlib.Repr()  # bounded in length and depth, whatever the engine sent
_SHORT.maxstring = _SHORT.maxother = EXCERPT_CHARS
_SHORT.maxlist = _SHORT.maxdict = 8


def _excerpt(value: Any) -> str:
    if isinstance(value, bytes):
        value = value[: EXCERPT_CHARS * 4].decode("utf-8", "replace")
    text = value if isinstance(value, str) else _SHORT.repr(value)
    return text[:EXCERPT_CHARS] + ("..." if len(text) > EXCERPT_CHARS else "")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _loads(body: str | bytes) -> Any:
    """`json.loads(body)`, with UTF-8 bytes (what engines send) decoded first: json.loads would guess their
    encoding in Python on every answer. Bytes that do not parse so (a BOM, UTF-16/32) go to json.loads as
    they are, which reads those too, or raises."""
    if type(body) is bytes:
        try:
            return json.loads(body.decode())
        except (ValueError, RecursionError):
            pass
    return json.loads(body)


def decode_body(body: Any) -> dict[str, Any]:
    """The answer as a JSON object: text is decoded here, so a cut body or an HTML page is a bad answer."""
    if isinstance(body, (str, bytes)):
        try:
            body = _loads(body)
        except (ValueError, RecursionError) as e:  # JSONDecodeError and bad UTF-8 are ValueErrors
            raise BadAnswer("body", f"not JSON ({type(e).__name__}: {str(e)[:80]})", body) from None
    if not isinstance(body, dict):
        raise BadAnswer("body", f"a JSON {type(body).__name__}, not an object", body)
    return body


def _finish(meta: dict[str, Any]) -> tuple[FinishType, Any]:
    finish = meta.get("finish_reason")
    if isinstance(finish, str):
        finish = {"type": finish}
    kind = finish.get("type") if isinstance(finish, dict) else None
    if kind not in FINISH_TYPES:
        raise BadAnswer("finish_reason", f"type must be one of {sorted(FINISH_TYPES)}", finish)
    return kind, finish.get("matched")


_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)


def _pairs(meta: dict[str, Any], vocab_size: int | None) -> tuple[list[int], list[float]]:
    pairs = meta.get("output_token_logprobs")
    if not isinstance(pairs, list):
        raise BadAnswer("output_token_logprobs", "missing or not a list (the request asked for log-probs)", pairs)
    top = vocab_size if vocab_size is not None else math.inf
    # The answer as JSON gives it (lists of a float and an int) is checked whole, in C-speed passes: the same
    # checks as the loop below, which finds and names the first bad item when any fails.
    # (map and itemgetter rather than comprehensions: no Python frame per pass)
    if pairs and set(map(type, pairs)) == {list} and min(map(len, pairs)) >= 2:
        lps = list(map(_FIRST, pairs))
        ids = list(map(_SECOND, pairs))
        if (
            set(map(type, lps)) == {float}
            and set(map(type, ids)) == {int}
            and not any(map(math.isnan, lps))
            and -math.inf < min(lps)
            and max(lps) <= LOGPROB_TOLERANCE
            and 0 <= min(ids)
            and max(ids) < top
        ):
            return ids, lps
    return _each_pair(pairs, top, vocab_size)


def _each_pair(pairs: list[Any], top: float, vocab_size: int | None) -> tuple[list[int], list[float]]:
    ids, lps = [], []
    for i, item in enumerate(pairs):  # per token: the fast path tests exact JSON types, the rest the helpers
        kind = type(item)
        if (kind is not list and kind is not tuple and not isinstance(item, (list, tuple))) or len(item) < 2:
            raise BadAnswer("output_token_logprobs", f"item {i} is not [logprob, token_id, ...]", item)
        lp, tid = item[0], item[1]
        if (
            type(lp) is not float and type(lp) is not int and not _is_number(lp)
        ) or not -math.inf < lp <= LOGPROB_TOLERANCE:  # (NaN fails both comparisons)
            raise BadAnswer("logprob", f"item {i}: must be a finite number <= 0 (+{LOGPROB_TOLERANCE})", item)
        if (type(tid) is not int and not _is_int(tid)) or not 0 <= tid < top:
            raise BadAnswer("token_id", f"item {i}: must be an integer in [0, {vocab_size})", item)
        ids.append(tid)
        lps.append(lp if type(lp) is float else float(lp))
    return ids, lps


def parse_generate_answer(
    body: Any, *, vocab_size: int | None = None, max_new_tokens: int | None = None, top_logprobs_num: int = 0
) -> EngineOutput:
    """The sampled ids and their log-probs (`meta_info.output_token_logprobs`, item[1] and item[0], as
    slime reads them), or `BadAnswer`. `output_ids`, when the engine sends it, must be the same ids;
    `vocab_size` and `max_new_tokens` bound the ids and their count when known. With `top_logprobs_num`
    the answer must carry `meta_info.output_top_logprobs`, one list per sampled id."""
    body = decode_body(body)
    meta = body.get("meta_info")
    if not isinstance(meta, dict):
        raise BadAnswer("meta_info", "missing or not an object", meta)
    kind, matched = _finish(meta)
    ids, lps = _pairs(meta, vocab_size)
    if "output_ids" in body and body["output_ids"] != ids:
        raise BadAnswer("output_ids", f"not the {len(ids)} id(s) of output_token_logprobs", body["output_ids"])
    if max_new_tokens is not None and len(ids) > max_new_tokens:
        raise BadAnswer("output_ids", f"{len(ids)} tokens for max_new_tokens {max_new_tokens}", ids)
    text, version = body.get("text") or "", meta.get("weight_version")
    if not isinstance(text, str):
        raise BadAnswer("text", "not a string", text)
    if version is not None and not isinstance(version, str):
        raise BadAnswer("weight_version", "not a string", version)
    tops = _top_pairs(meta, len(ids), vocab_size) if top_logprobs_num else []
    return EngineOutput(ids, lps, text, kind, matched, version, body, tops)


def _top_pairs(meta: dict[str, Any], n: int, vocab_size: int | None) -> list[list[tuple[float, int]]]:
    """`output_top_logprobs`: per position, `[[logprob, token_id, text_or_null], ...]`, checked as the
    sampled pairs are."""
    tops = meta.get("output_top_logprobs")
    if not isinstance(tops, list) or len(tops) != n:
        raise BadAnswer("output_top_logprobs", f"missing, or not one list per sampled id ({n})", tops)
    out = []
    for i, row in enumerate(tops):
        if not isinstance(row, list):
            raise BadAnswer("output_top_logprobs", f"position {i} is not a list", row)
        ids, lps = _pairs({"output_token_logprobs": row}, vocab_size)
        out.append(list(zip(lps, ids)))
    return out


# sglang-router (0.3.2) error codes that say more than their HTTP status
ROUTER_FAULTS = {"read_response_body_failed": "answer_cut"}  # the engine's answer broke off mid-way


def router_fault(status: int, body: str) -> str | None:
    """The reason of a router error answer when its code names the engine's fault, so a cut answer
    is counted as `answer_cut` (as when talking to the engine directly), not as a bare `http_500`."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    return ROUTER_FAULTS.get(error.get("code")) if isinstance(error, dict) else None
