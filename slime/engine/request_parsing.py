"""Request bodies of the embedded engine's HTTP API turned into typed values. A bad body raises
`BadRequest` whose message names the offending field (the server answers 400 with it); None values mean
the default, since the sglang-router sends them."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from slime.engine.http_errors import error_response
from slime.engine.sampling import SamplingParams


class BadRequest(ValueError):
    """A client error; the message names the offending field."""


@dataclass(frozen=True)
class GenerateBody:
    """A `/generate` body, one entry per input of a batch (a single input is a batch of one)."""

    prompts: list[list[int]]
    params: list[SamplingParams]
    rids: list[str | None]
    return_logprob: list[bool]
    logprob_start_lens: list[int | None]
    stream: bool
    top_logprobs_nums: list[int]  # per input: the k most likely tokens reported per position (0: none)
    batch: bool


def parse_generate_body(body: dict, tokenizer: Any, vocab_size: int, context_length: int) -> GenerateBody:
    prompts, batch = parse_prompts(body, tokenizer, vocab_size, context_length)
    n = len(prompts)
    sps = _per_item(body.get("sampling_params"), n, "sampling_params")
    params = [parse_sampling_params(sp, len(p), context_length) for sp, p in zip(sps, prompts)]
    rids = _rids(body.get("rid"), n, batch)
    logprob = _per_item(body.get("return_logprob"), n, "return_logprob")
    starts = [
        parse_logprob_start_len(v, len(p))
        for v, p in zip(_per_item(body.get("logprob_start_len"), n, "logprob_start_len"), prompts)
    ]
    tops = [parse_top_logprobs_num(v) for v in _per_item(body.get("top_logprobs_num"), n, "top_logprobs_num")]
    stream = bool(body.get("stream") or False)
    if stream and batch:
        raise BadRequest("stream is not supported with batch input")
    return GenerateBody(
        prompts=prompts,
        params=params,
        rids=rids,
        return_logprob=[bool(lp) for lp in logprob],
        logprob_start_lens=starts,
        stream=stream,
        batch=batch,
        top_logprobs_nums=tops,
    )


def parse_prompts(body: dict, tokenizer: Any, vocab_size: int, context_length: int) -> tuple[list[list[int]], bool]:
    """The prompts' token ids (`text` is encoded without special tokens) and whether the input is a batch."""
    ids, text = body.get("input_ids"), body.get("text")
    if ids is None and text is None:
        raise BadRequest("either input_ids or text is required")
    if ids is not None:
        batch = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        prompts = ids if batch else [ids]
        for p in prompts:
            if not isinstance(p, list) or not all(_is_int(t) for t in p):
                raise BadRequest("input_ids must be a list of integers (or a list of such lists)")
    else:
        batch = isinstance(text, list)
        texts = text if batch else [text]
        if not all(isinstance(t, str) for t in texts):
            raise BadRequest("text must be a string or a list of strings")
        prompts = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    _check_prompts(prompts, "input_ids" if ids is not None else "text", vocab_size, context_length)
    return prompts, batch


def _check_prompts(prompts: list[list[int]], field: str, vocab: int, ctx: int) -> None:
    if not prompts:
        raise BadRequest(f"{field} is empty")
    for p in prompts:
        if not p:
            raise BadRequest(f"{field} is empty")
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise BadRequest(f"input_ids contains ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        if len(p) >= ctx:
            raise BadRequest(f"{field} is too long: {len(p)} tokens, the model's context length is {ctx}")


def _rids(rid: Any, n: int, batch: bool) -> list[str | None]:
    """A batch's rids: a list, or one string suffixed `-i` per input."""
    if batch and isinstance(rid, str):
        rids = [f"{rid}-{i}" for i in range(n)]
    else:
        rids = _per_item(rid, n, "rid") if batch else [rid]
    if any(r is not None and not isinstance(r, str) for r in rids):
        raise BadRequest("rid must be a string (or a list of strings for batch input)")
    return rids


def parse_sampling_params(d: Any, prompt_len: int, context_length: int) -> SamplingParams:
    """SGLang sampling_params dict -> SamplingParams. None values mean default (the router sends them)."""
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise BadRequest("sampling_params must be an object")
    max_new = _int(d, "max_new_tokens", 128)
    if max_new < 0:
        raise BadRequest(f"sampling_params.max_new_tokens must be >= 0, got {max_new}")
    temperature = _float(d, "temperature", 1.0)
    if temperature < 0:
        raise BadRequest(f"sampling_params.temperature must be >= 0, got {temperature}")
    top_p = _float(d, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise BadRequest(f"sampling_params.top_p must be in (0, 1], got {top_p}")
    top_k = _int(d, "top_k", -1)
    if top_k < -1:
        raise BadRequest(f"sampling_params.top_k must be -1 (all) or >= 1, got {top_k}")
    stop, stop_ids = _stop_strings(d.get("stop")), _stop_token_ids(d.get("stop_token_ids"))
    seed = d.get("sampling_seed")
    if seed is not None and not _is_int(seed):
        raise BadRequest(f"sampling_params.sampling_seed must be an integer, got {seed!r}")
    return SamplingParams(
        max_new_tokens=min(max_new, max(context_length - prompt_len, 0)),
        temperature=temperature,
        top_p=top_p,
        top_k=-1 if top_k == 0 else top_k,
        min_new_tokens=_int(d, "min_new_tokens", 0, lo=0),
        stop=[s for s in stop if s],
        stop_token_ids=list(stop_ids),
        ignore_eos=bool(d.get("ignore_eos") or False),
        skip_special_tokens=bool(d.get("skip_special_tokens", True) is not False),
        spaces_between_special_tokens=bool(d.get("spaces_between_special_tokens", True) is not False),
        no_stop_trim=bool(d.get("no_stop_trim") or False),
        sampling_seed=seed,
    )


def _stop_strings(stop: Any) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise BadRequest("sampling_params.stop must be a string or a list of strings")
    return stop


def _stop_token_ids(stop_ids: Any) -> list[int]:
    if stop_ids is None:
        return []
    if _is_int(stop_ids):
        return [stop_ids]
    if not (isinstance(stop_ids, list) and all(_is_int(i) for i in stop_ids)):
        raise BadRequest("sampling_params.stop_token_ids must be a list of integers")
    return stop_ids


def parse_logprob_start_len(value: Any, prompt_len: int) -> int | None:
    """SGLang's `logprob_start_len`: None or -1 = only the last prompt token; else a prompt position."""
    if value is None or value == -1:
        return None
    if not _is_int(value):
        raise BadRequest(f"logprob_start_len must be an integer, got {value!r}")
    if not 0 <= value < prompt_len:
        raise BadRequest(
            f"logprob_start_len must be -1 or in [0, {prompt_len}) for a prompt of {prompt_len} tokens, got {value}"
        )
    return value


def parse_top_logprobs_num(value: Any) -> int:
    """SGLang's `top_logprobs_num`: None or a non-negative integer (with `return_logprob`)."""
    if value is None:
        return 0
    if not _is_int(value) or value < 0:
        raise BadRequest(f"top_logprobs_num must be a non-negative integer, got {value!r}")
    return value


def parse_weight_version(body: dict) -> str | None:
    v = body.get("weight_version")
    if v is not None and not isinstance(v, (str, int)):
        raise BadRequest(f"weight_version must be a string, got {v!r}")
    return None if v is None else str(v)


async def generation_body(request: Any) -> dict | JSONResponse:
    """A generation request's body (`/generate`, the OpenAI routes): its JSON object, or the 400 naming what it
    is instead (SGLang refuses both)."""
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return error_response(400, "request body must be JSON")
    return body if isinstance(body, dict) else error_response(400, "request body must be a JSON object")


async def read_json_object(request: Request) -> dict:
    """The body of a control request, {} when it is missing or not a JSON object (SGLang is as lenient)."""
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return body if isinstance(body, dict) else {}


async def read_strict_json_object(request: Request) -> dict:
    """The JSON object of a weight-sync request (parsed off the event loop: tensor bodies can be large)."""
    raw = await request.body()
    try:
        body = await asyncio.to_thread(json.loads, raw) if raw else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadRequest("request body must be JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(d: dict, key: str, default: int, lo: int | None = None) -> int:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
        raise BadRequest(f"sampling_params.{key} must be an integer, got {v!r}")
    if lo is not None and v < lo:
        raise BadRequest(f"sampling_params.{key} must be >= {lo}, got {v}")
    return int(v)


def _float(d: dict, key: str, default: float) -> float:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadRequest(f"sampling_params.{key} must be a number, got {v!r}")
    return float(v)


def _per_item(value: Any, n: int, name: str) -> list:
    """Broadcast a scalar/dict field over a batch of n inputs, or check a per-input list."""
    if isinstance(value, list):
        if len(value) != n:
            raise BadRequest(f"{name} has {len(value)} entries for {n} inputs")
        return value
    return [value] * n
