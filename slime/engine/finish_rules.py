"""When a request is finished, checked after each sampled token, in this order:

a stop token (stop_token_ids, plus the model's eos ids unless ignore_eos) => "stop" with the token id; a
stop string found in the decoded output => "stop" with the string (output_ids keep the token that
completed it); max_new_tokens reached => "length" (so a stop on the last allowed token is reported as
"stop"). Stop tokens and strings only count once min_new_tokens tokens exist. (Abort => "abort" with the
tokens so far is decided by the decode thread, not here.)
"""

from __future__ import annotations

from typing import Any

from slime.engine.request import Request

_STOP_WINDOW_EXTRA_TOKENS = 8  # decoded tail = longest stop string (in chars, an upper bound on tokens) + this


def stop_ids(stop_token_ids: list[int], ignore_eos: bool, eos_ids: frozenset[int]) -> frozenset[int]:
    """The token ids that end a request."""
    return frozenset(stop_token_ids) | (frozenset() if ignore_eos else eos_ids)


def finish_reason(req: Request, tokenizer: Any) -> dict | None:
    """SGLang's `finish_reason` once the request's last sampled token ends it, else None."""
    p = req.params
    n = len(req.output_ids)
    if n >= p.min_new_tokens:
        token = req.output_ids[-1]
        if token in req.stop_ids:
            return {"type": "stop", "matched": token}
        if p.stop:
            matched = _stop_string(req, tokenizer)
            if matched is not None:
                return {"type": "stop", "matched": matched}
    if n >= p.max_new_tokens:
        return {"type": "length", "length": p.max_new_tokens}
    return None


def _stop_string(req: Request, tokenizer: Any) -> str | None:
    stops = req.params.stop
    window = max(len(s) for s in stops) + _STOP_WINDOW_EXTRA_TOKENS
    # special tokens kept, so a stop string such as "<|im_end|>" can match too
    tail = tokenizer.decode(req.output_ids[-window:], skip_special_tokens=False)
    return next((s for s in stops if s and s in tail), None)
