"""The SGLang `/generate` answer of a request: `text` (cut before a matched stop unless no_stop_trim),
`output_ids` and `meta_info` (finish_reason, token counts, weight version, and with return_logprob
`output_token_logprobs` and `input_token_logprobs` as `[logprob, token_id, null]`). `cached_tokens` is
always 0: this engine has no prefix cache. Every answer comes from one weight version (see decode_thread).
"""

from __future__ import annotations

import time
from typing import Any

from slime.engine.request import Request


def build_response(req: Request, reason: dict | None, tokenizer: Any, engine_version: str) -> dict:
    """`reason` None for a streamed chunk still running; `engine_version` is reported for a request
    that never reached its prefill (aborted while waiting)."""
    ids = req.output_ids
    version = req.weight_version or engine_version
    text = _text(req, reason, tokenizer)
    meta = {
        "id": req.rid,
        "finish_reason": reason,
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(ids),
        "cached_tokens": 0,
        "weight_version": version,
        "weight_versions": [{"version": version, "start": 0, "end": len(ids)}],
        "e2e_latency": time.monotonic() - req.created,
    }
    if req.return_logprob:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(req.logprobs, ids)]
        # empty only if the request never reached its prefill (aborted while waiting)
        scored = req.input_ids[req.logprob_start_len :]
        meta["input_token_logprobs"] = [[lp, t, None] for lp, t in zip(req.input_logprobs, scored)]
        if req.top_logprobs_num:
            meta["output_top_logprobs"] = [[[lp, t, None] for lp, t in row] for row in req.top_logprobs]
    return {"text": text, "output_ids": list(ids), "meta_info": meta}


def _text(req: Request, reason: dict | None, tokenizer: Any) -> str:
    skip = req.params.skip_special_tokens
    text = tokenizer.decode(req.output_ids, skip_special_tokens=skip)
    if not reason or reason["type"] != "stop" or req.params.no_stop_trim:
        return text
    if isinstance(reason["matched"], str):
        cut = text.find(reason["matched"])
        return text[:cut] if cut >= 0 else text
    return tokenizer.decode(req.output_ids[:-1], skip_special_tokens=skip)
