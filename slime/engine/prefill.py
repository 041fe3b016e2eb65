"""The prefill of one request, run alone so its prompt computation is identical to a solo run, and
SGLang's `input_token_logprobs` scored from it.

Prompt tokens are scored from `logprob_start_len` (default the last prompt token) at T = 1, as SGLang
does unless patched to scale them; the first entry is None, as in SGLang, so a teacher engine scores a
whole sequence with `max_new_tokens: 0`. A vision-language request's forward also takes its images (pixel
values, grids) and explicit M-RoPE positions (`slime.utils.vision_model`).
"""

from __future__ import annotations

from typing import Any

import torch

from slime.engine.request import Request
from slime.utils.vision_model import mrope_positions

_SCORE_CHUNK_ROWS = 256  # rows of vocabulary-sized log-softmax at a time when scoring a long prompt


def prefill(model: Any, req: Request, use_cache: bool) -> Any:
    """The prompt's forward (None when nothing needs computing). With `return_logprob` it keeps the
    logits from `logprob_start_len` on and records `req.input_logprobs`: None for the first reported
    token, then log_softmax(logits)[token] of each later prompt token given the tokens before it."""
    ids = req.input_ids
    if not req.return_logprob or req.logprob_start_len >= len(ids) - 1:
        if req.return_logprob:
            req.input_logprobs = [None]
        if not use_cache:
            return None  # nothing to compute: the one reported prompt token is always None
        return model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1, **_vision(model, req))
    out = model(
        input_ids=torch.tensor([ids]),
        use_cache=use_cache,
        logits_to_keep=len(ids) - req.logprob_start_len,
        **_vision(model, req),
    )
    req.input_logprobs = [None, *token_logprobs(out.logits[0, :-1], ids[req.logprob_start_len + 1 :])]
    return out


def _vision(model: Any, req: Request) -> dict[str, Any]:
    """A request with images: the forward's pixel values, grids and M-RoPE positions; records the
    position offset its decode steps continue from."""
    if req.images is None:
        return {}
    positions, deltas = mrope_positions(model, torch.tensor([req.input_ids]), req.images["image_grid_thw"])
    req.position_delta = int(deltas[0])
    return {**req.images, "position_ids": positions}


def token_logprobs(logits: torch.Tensor, targets: list[int]) -> list[float]:
    """log_softmax(logits[i])[targets[i]] per row, in float32, a chunk of rows at a time."""
    out: list[float] = []
    target = torch.tensor(targets)
    for lo in range(0, len(targets), _SCORE_CHUNK_ROWS):
        rows = torch.log_softmax(logits[lo : lo + _SCORE_CHUNK_ROWS].float(), dim=-1)
        out += rows.gather(-1, target[lo : lo + _SCORE_CHUNK_ROWS, None])[:, 0].tolist()
    return out
