"""SGLang-protocol HTTP server for the embedded CPU engine (FastAPI + uvicorn over `HFBatcher`).

It speaks the subset of SGLang's HTTP API that slime, the sglang-router and our rollout code use,
with the same paths, bodies and response shapes, so the rest of the system cannot tell it from a
real SGLang engine. All model work happens in the batcher's decode thread; handlers only
validate, enqueue and await. `return_logprob` answers `meta_info.output_token_logprobs` and
`meta_info.input_token_logprobs` (`[logprob, token_id, null]` per token, SGLang's layout; input entries
from `logprob_start_len`, the first one null), so one engine can score another's samples (a teacher
for on-policy distillation: `max_new_tokens: 0`, `logprob_start_len: 0`). `/get_load` returns one dict (num_running_reqs, num_waiting_reqs,
num_reqs, num_tokens, decode_steps_total, max_batch_size_seen, paused, weights_released,
weight_version, requests_restarted, weight_updates_total).

Weight sync (SGLang's paths and bodies, answers `{"success", "message", ...}`, 400 on refusal):
`/update_weights_from_disk`, `/update_weights_from_tensor` (payloads of slime.engine.weight_transfer),
`/init_weights_update_group` (gloo only; optional `timeout` seconds, default 120; optional
`weight_transport` "auto" | "broadcast": "auto" maps the trainer's shared-memory ring when on its host,
see slime.engine.weight_ring),
`/update_weights_from_distributed`, `/destroy_weights_update_group`, `/get_weight_version`,
`/weights_checker` (`action`: snapshot | compare [with optional `checksums` {name: sha256}] |
compare_checksum | checksum | reset/reset_tensors; a compare answers per-tensor equality, 200 when
all equal, 400 otherwise). `/pause_generation` `mode`: in_place (default here, SGLang's default is
abort) | retract (same as in_place: a request that has tokens is recomputed if the weights change)
| abort. See batcher.py for why no answer mixes two weight versions.

    python -m slime.engine.hf_server --model-path DIR --host 127.0.0.1 --port 30000 \
        [--max-batch-size 32] [--num-threads K] [--weight-version V] [--dtype float32] [--log-level info]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from slime.engine.batcher import EngineReleasedError, HFBatcher, PreloadedModel, SamplingParams
from slime.engine.weight_transfer import WeightFormatError, deserialize_named_tensors
from slime.engine.weight_updates import (
    UpdateGroups, WeightChecker, WeightUpdateError, check_against_model, model_tensors, parse_metadata,
)
from slime.utils.client_gone import client_gone
from slime.utils.startup_trace import mark

logger = logging.getLogger(__name__)
BACKEND = "slime-hf"


class BadRequest(ValueError):
    """A client error; the message names the offending field."""


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


def _released() -> JSONResponse:
    return _error(503, "model weights are released (release_memory_occupation); "
                       "call /resume_memory_occupation before generating")


# ---------------------------------------------------------------------------- request parsing
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
    top_k = -1 if top_k == 0 else top_k
    stop = d.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise BadRequest("sampling_params.stop must be a string or a list of strings")
    stop_ids = d.get("stop_token_ids")
    if stop_ids is None:
        stop_ids = []
    elif isinstance(stop_ids, int) and not isinstance(stop_ids, bool):
        stop_ids = [stop_ids]
    elif not (isinstance(stop_ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in stop_ids)):
        raise BadRequest("sampling_params.stop_token_ids must be a list of integers")
    seed = d.get("sampling_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest(f"sampling_params.sampling_seed must be an integer, got {seed!r}")
    return SamplingParams(
        max_new_tokens=min(max_new, max(context_length - prompt_len, 0)),
        temperature=temperature, top_p=top_p, top_k=top_k,
        min_new_tokens=_int(d, "min_new_tokens", 0, lo=0),
        stop=[s for s in stop if s], stop_token_ids=list(stop_ids),
        ignore_eos=bool(d.get("ignore_eos") or False),
        skip_special_tokens=bool(d.get("skip_special_tokens", True) is not False),
        spaces_between_special_tokens=bool(d.get("spaces_between_special_tokens", True) is not False),
        no_stop_trim=bool(d.get("no_stop_trim") or False),
        sampling_seed=seed,
    )


def parse_logprob_start_len(value: Any, prompt_len: int) -> int | None:
    """SGLang's `logprob_start_len`: None or -1 = only the last prompt token; else a prompt position."""
    if value is None or value == -1:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"logprob_start_len must be an integer, got {value!r}")
    if not 0 <= value < prompt_len:
        raise BadRequest(f"logprob_start_len must be -1 or in [0, {prompt_len}) for a prompt of {prompt_len} "
                         f"tokens, got {value}")
    return value


def _per_item(value: Any, n: int, name: str, is_item) -> list:
    """Broadcast a scalar/dict field over a batch of n inputs, or check a per-input list."""
    if isinstance(value, list) and not is_item(value):
        if len(value) != n:
            raise BadRequest(f"{name} has {len(value)} entries for {n} inputs")
        return value
    return [value] * n


class Server:
    """Request handling around one HFBatcher (kept as a class so tests can build apps in-process)."""

    def __init__(self, batcher: HFBatcher, tokenizer: Any = None):
        from transformers import AutoTokenizer

        self.batcher = batcher
        # Own tokenizer instance: the batcher's one is used concurrently by the decode thread.
        self.tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(batcher.tokenizer_path)
        self.started = time.time()
        self.groups = UpdateGroups()
        self.checker = WeightChecker()

    def _prompts(self, body: dict) -> tuple[list[list[int]], bool]:
        ids, text = body.get("input_ids"), body.get("text")
        if ids is None and text is None:
            raise BadRequest("either input_ids or text is required")
        if ids is not None:
            batch = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
            prompts = ids if batch else [ids]
            for p in prompts:
                if not isinstance(p, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in p):
                    raise BadRequest("input_ids must be a list of integers (or a list of such lists)")
        else:
            batch = isinstance(text, list)
            texts = text if batch else [text]
            if not all(isinstance(t, str) for t in texts):
                raise BadRequest("text must be a string or a list of strings")
            prompts = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        field = "input_ids" if ids is not None else "text"
        if not prompts:
            raise BadRequest(f"{field} is empty")
        vocab, ctx = self.batcher.vocab_size, self.batcher.context_length
        for p in prompts:
            if not p:
                raise BadRequest(f"{field} is empty")
            bad = [t for t in p if not 0 <= t < vocab]
            if bad:
                raise BadRequest(f"input_ids contains ids outside the vocabulary [0, {vocab}): {bad[:5]}")
            if len(p) >= ctx:
                raise BadRequest(f"{field} is too long: {len(p)} tokens, the model's context length is {ctx}")
        return prompts, batch

    async def generate(self, request: Request) -> Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "request body must be JSON")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        if not self.batcher.serving:
            return _released()
        try:
            prompts, batch = self._prompts(body)
            n = len(prompts)
            sps = _per_item(body.get("sampling_params"), n, "sampling_params", lambda v: False)
            params = [parse_sampling_params(sp, len(p), self.batcher.context_length) for sp, p in zip(sps, prompts)]
            rid = body.get("rid")
            if batch and isinstance(rid, str):
                rids = [f"{rid}-{i}" for i in range(n)]
            else:
                rids = _per_item(rid, n, "rid", lambda v: False) if batch else [rid]
            if any(r is not None and not isinstance(r, str) for r in rids):
                raise BadRequest("rid must be a string (or a list of strings for batch input)")
            logprob = _per_item(body.get("return_logprob"), n, "return_logprob", lambda v: False)
            starts = [parse_logprob_start_len(v, len(p)) for v, p in
                      zip(_per_item(body.get("logprob_start_len"), n, "logprob_start_len", lambda v: False), prompts)]
            stream = bool(body.get("stream") or False)
            if stream and batch:
                raise BadRequest("stream is not supported with batch input")
            submitted = []
            try:
                for p, sp, r, lp, start in zip(prompts, params, rids, logprob, starts):
                    submitted.append(self.batcher.submit(p, sp, rid=r, return_logprob=bool(lp),
                                                         logprob_start_len=start, stream=stream))
            except Exception:  # all or nothing: do not leave half a batch decoding for nobody
                for r, _, _ in submitted:
                    self.batcher.abort(r)
                raise
        except BadRequest as exc:
            return _error(400, str(exc))
        except EngineReleasedError:
            return _released()
        except ValueError as exc:  # e.g. duplicate rid
            return _error(400, str(exc))
        if stream:
            rid, fut, chunks = submitted[0]
            return StreamingResponse(self._sse(rid, fut, chunks), media_type="text/event-stream")
        work = asyncio.gather(*(fut for _, fut, _ in submitted))
        gone = asyncio.ensure_future(client_gone(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not work.done():  # the client went away (as SGLang: a disconnected request is aborted)
            for rid, _, _ in submitted:
                self.batcher.abort(rid)
        try:
            results = await work
        except EngineReleasedError:
            return _released()
        except asyncio.CancelledError:  # client went away: do not keep decoding for nobody
            for rid, _, _ in submitted:
                self.batcher.abort(rid)
            raise
        except Exception as exc:  # the engine failed this request (logged by the batcher)
            return _error(500, f"generation failed: {exc}")
        return JSONResponse(results if batch else results[0])

    async def _sse(self, rid: str, fut: asyncio.Future, chunks: asyncio.Queue):
        try:
            while (chunk := await chunks.get()) is not None:
                yield f"data: {json.dumps(chunk)}\n\n"
            if fut.done() and fut.exception() is not None:
                yield f"data: {json.dumps({'error': {'message': str(fut.exception())}})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if not fut.done():
                self.batcher.abort(rid)

    async def health_generate(self) -> Response:
        if not self.batcher.serving:
            return _released()
        try:
            one_token = SamplingParams(max_new_tokens=1, temperature=0)
            await self.batcher.generate([0], one_token, rid=f"health-{time.time_ns()}")
        except EngineReleasedError:
            return _released()
        return Response(status_code=200)

    def server_info(self) -> dict:
        b = self.batcher
        return {"model_path": b.model_path, "tokenizer_path": b.tokenizer_path, "served_model_name": b.model_path,
                "backend": BACKEND, "version": BACKEND, "weight_version": b.weight_version,
                "context_length": b.context_length, "max_total_num_tokens": b.context_length * b.max_batch_size,
                "max_running_requests": b.max_batch_size, "max_batch_size": b.max_batch_size,
                "tp_size": 1, "dp_size": 1, "disaggregation_mode": "null", "is_generation": True,
                "weights_released": not b.weights_loaded, "paused": b.paused,
                "uptime_s": time.time() - self.started, "internal_states": [b.load()]}

    def model_info(self) -> dict:
        b = self.batcher
        cfg = getattr(b.model, "config", None)
        return {"model_path": b.model_path, "tokenizer_path": b.tokenizer_path, "is_generation": True,
                "weight_version": b.weight_version, "preferred_sampling_params": None,
                "model_type": getattr(cfg, "model_type", None), "architectures": getattr(cfg, "architectures", None)}

    def metrics(self) -> str:
        b, s = self.batcher, self.batcher.stats
        load = b.load()
        label = '{model_name="%s"}' % b.model_path.replace('"', "'")
        rows = [("sglang:num_running_reqs", "gauge", "Requests in the running batch", load["num_running_reqs"]),
                ("sglang:num_queue_reqs", "gauge", "Requests waiting for a batch slot", load["num_waiting_reqs"]),
                ("sglang:num_requests_total", "counter", "Generation requests received", s["requests_total"]),
                ("sglang:num_aborted_requests_total", "counter", "Requests aborted", s["requests_aborted"]),
                ("sglang:prompt_tokens_total", "counter", "Prompt tokens prefilled", s["prompt_tokens_total"]),
                ("sglang:generation_tokens_total", "counter", "Tokens generated", s["generated_tokens_total"]),
                ("slime_hf:decode_steps_total", "counter", "Batched decode steps run", s["decode_steps_total"]),
                ("slime_hf:max_batch_size_seen", "gauge", "Largest decode batch so far", s["max_batch_size_seen"]),
                ("slime_hf:weights_released", "gauge", "1 while weights are released", int(not b.weights_loaded))]
        out = []
        for name, kind, help_, value in rows:
            out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{label} {value}"]
        return "\n".join(out) + "\n"


async def _json_body(request: Request) -> dict:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return body if isinstance(body, dict) else {}


async def _strict_body(request: Request) -> dict:
    """The JSON object of a weight-sync request (parsed off the event loop: tensor bodies can be large)."""
    raw = await request.body()
    try:
        body = await asyncio.to_thread(json.loads, raw) if raw else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadRequest("request body must be JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def _version(body: dict) -> str | None:
    v = body.get("weight_version")
    if v is not None and not isinstance(v, (str, int)):
        raise BadRequest(f"weight_version must be a string, got {v!r}")
    return None if v is None else str(v)


def _fail(status: int, message: str) -> JSONResponse:
    return JSONResponse({"success": False, "message": message}, status_code=status)


class WeightSync:
    """Handlers of the weight-sync endpoints (SGLang's names and bodies) around one Server."""

    def __init__(self, srv: Server):
        self.srv, self.batcher = srv, srv.batcher

    def _done(self, restarted: int) -> dict:
        return {"success": True, "message": "Succeeded to update model weights.",
                "weight_version": self.batcher.weight_version, "num_restarted_requests": restarted}

    async def update_from_tensor(self, request: Request) -> Response:
        b = self.batcher
        try:
            body = await _strict_body(request)
            items = body.get("serialized_named_tensors")
            if not (isinstance(items, list) and len(items) == 1 and isinstance(items[0], str)):
                raise BadRequest("serialized_named_tensors must be a list of one string (one per TP rank; this "
                                 "engine has tp_size 1) made by slime.engine.weight_transfer.serialize_named_tensors")
            if body.get("load_format") not in (None, "flattened_bucket"):
                raise BadRequest(f"load_format must be null or 'flattened_bucket', got {body.get('load_format')!r}")
            version = _version(body)
        except BadRequest as exc:
            return _fail(400, str(exc))
        if body.get("abort_all_requests"):
            b.abort_all()
        async with b.weights_lock:
            if not b.weights_loaded:
                return _fail(503, "model weights are released; call /resume_memory_occupation first")
            try:
                named = await asyncio.to_thread(deserialize_named_tensors, items[0])
                check_against_model(model_tensors(b.model), [n for n, _ in named], [t.dtype for _, t in named],
                                    [list(t.shape) for _, t in named])
            except (WeightFormatError, WeightUpdateError) as exc:
                return _fail(400, str(exc))
            restarted = await b.apply_weights(named, version)
        return JSONResponse(self._done(restarted))

    async def init_group(self, request: Request) -> Response:
        try:
            body = await _strict_body(request)
            args = [body.get(k) for k in ("master_address", "master_port", "rank_offset", "world_size")]
            answer = await asyncio.to_thread(self.srv.groups.init, *args,
                                             body.get("group_name", "weight_update_group"), body.get("backend", "gloo"),
                                             body.get("timeout"), body.get("weight_transport"))
        except (BadRequest, WeightUpdateError) as exc:
            return _fail(400, str(exc))
        return JSONResponse({"success": True, **answer})

    async def destroy_group(self, request: Request) -> Response:
        try:
            body = await _strict_body(request)
            msg = self.srv.groups.destroy(body.get("group_name", "weight_update_group"))
        except (BadRequest, WeightUpdateError) as exc:
            return _fail(400, str(exc))
        return JSONResponse({"success": True, "message": msg})

    async def update_from_distributed(self, request: Request) -> Response:
        b = self.batcher
        try:
            body = await _strict_body(request)
            names, dtypes, shapes = parse_metadata(body.get("names"), body.get("dtypes"), body.get("shapes"))
            version = _version(body)
        except (BadRequest, WeightUpdateError) as exc:
            return _fail(400, str(exc))
        if body.get("abort_all_requests"):
            b.abort_all()
        group, load_format = body.get("group_name", "weight_update_group"), body.get("load_format")
        groups = self.srv.groups
        async with b.weights_lock:
            refusal = None
            try:
                if not b.weights_loaded:
                    refusal = _fail(503, "model weights are released; call /resume_memory_occupation first")
                else:
                    check_against_model(model_tensors(b.model), names, dtypes, shapes)
            except WeightUpdateError as exc:
                refusal = _fail(400, str(exc))
            try:
                # through the shared-memory ring any layout is copied straight into the parameters
                ring = await asyncio.to_thread(groups.uses_ring, group)
                if refusal is None and (load_format is None or ring):
                    # straight into the parameters, in the decode thread: no copy, and nothing decodes meanwhile
                    restarted = await b.write_weights(
                        lambda table: groups.receive(group, names, dtypes, shapes, None, [table[n] for n in names]),
                        version)
                    return JSONResponse(self._done(restarted))
                # A refused bucket is still received (and dropped), so the broadcast completes on every rank.
                received = await asyncio.to_thread(groups.receive, group, names, dtypes, shapes, load_format)
            except WeightUpdateError as exc:
                return _fail(400, str(exc))
            except RuntimeError as exc:  # the broadcast failed or timed out
                return _fail(500, f"{exc}; the weights may be partly updated (version kept): push them again")
            if refusal is not None:
                return refusal
            restarted = await b.apply_weights(received, version)
        return JSONResponse(self._done(restarted))

    async def weights_checker(self, request: Request) -> Response:
        b, checker = self.batcher, self.srv.checker
        try:
            body = dict(request.query_params) if request.method == "GET" else await _strict_body(request)
        except BadRequest as exc:
            return _fail(400, str(exc))
        action = body.get("action")
        if action not in WeightChecker.ACTIONS:
            return _fail(400, f"action must be one of {', '.join(WeightChecker.ACTIONS)}, got {action!r}")
        if not b.weights_loaded:
            return _fail(503, "model weights are released; call /resume_memory_occupation first")
        if action in ("reset", "reset_tensors"):
            seed = body.get("seed")
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                return _fail(400, f"seed must be an integer, got {seed!r}")
            restarted = await b.reset_tensors(seed)
            return JSONResponse({"success": True, "message": "Weights reset to random values.",
                                 "num_restarted_requests": restarted})
        expected = body.get("checksums")
        if action == "compare_checksum" and expected is None:
            return _fail(400, "compare_checksum needs checksums: {tensor name: sha256 hex}")
        if expected is not None and not (isinstance(expected, dict) and expected
                                         and all(isinstance(k, str) and isinstance(v, str) for k, v in expected.items())):
            return _fail(400, "checksums must be a non-empty object {tensor name: sha256 hex string}")
        if action.startswith("compare") and expected is None:
            if checker.snapshot is None:
                return _fail(400, "no snapshot to compare with: call check_weights('snapshot') first, or send checksums")
            expected = checker.snapshot
        actual = await b.weight_checksums()
        if action == "snapshot":
            checker.snapshot = actual
            return JSONResponse({"success": True, "message": f"Snapshot of {len(actual)} tensors taken.",
                                 "num_tensors": len(actual), "weight_version": b.weight_version})
        if action == "checksum":
            return JSONResponse({"success": True, "message": f"{len(actual)} tensors.", "checksums": actual,
                                 "weight_version": b.weight_version})
        result = WeightChecker.compare(actual, expected)
        result["weight_version"] = b.weight_version
        return JSONResponse(result, status_code=200 if result["equal"] else 400)


def create_app(batcher: HFBatcher, tokenizer: Any = None) -> FastAPI:
    """`tokenizer`: the handlers' own instance if one is already loaded (else loaded here)."""
    srv = Server(batcher, tokenizer)
    sync = WeightSync(srv)
    app = FastAPI(title="slime embedded CPU engine (SGLang protocol)")
    app.state.server = srv

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request):
        return await srv.generate(request)

    @app.get("/health")
    async def health():
        return Response(status_code=200)  # like SGLang: up means 200, also while weights are released

    @app.get("/health_generate")
    async def health_generate():
        return await srv.health_generate()

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info():
        return srv.server_info()

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info():
        return srv.model_info()

    @app.get("/get_load")
    async def get_load():
        return batcher.load()

    @app.get("/get_weight_version")
    async def get_weight_version():
        return {"weight_version": batcher.weight_version}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(srv.metrics(), media_type="text/plain; version=0.0.4")

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await _json_body(request)
        if body.get("abort_all"):
            batcher.abort_all()
        elif body.get("rid"):
            batcher.abort(str(body["rid"]))
        else:
            return _error(400, "abort_request needs rid or abort_all: true")
        return {"success": True}

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        mode = (await _json_body(request)).get("mode")
        if mode not in (None, "in_place", "retract", "abort"):
            return _fail(400, f"mode must be 'in_place', 'retract' or 'abort', got {mode!r}")
        if mode == "abort":  # drop in-flight requests (answered with finish_reason abort), then pause
            batcher.abort_all()
        await batcher.pause()
        return {"success": True, "message": "Generation paused."}

    @app.post("/continue_generation")
    async def continue_generation():
        batcher.resume_generation()
        return {"success": True, "message": "Generation continued."}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        return {"success": True, "message": "Cache flushed."}  # no prefix cache to flush

    @app.post("/release_memory_occupation")
    async def release_memory_occupation(request: Request):
        await batcher.release((await _json_body(request)).get("tags"))
        return {"success": True, "message": "Memory released."}

    @app.post("/resume_memory_occupation")
    async def resume_memory_occupation(request: Request):
        try:
            await batcher.resume((await _json_body(request)).get("tags"))
        except Exception as exc:
            return _error(500, f"failed to reload weights from {batcher.model_path}: {exc}")
        return {"success": True, "message": "Memory resumed."}

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        body = await _json_body(request)
        if not isinstance(body.get("model_path"), str):
            return _error(400, "model_path (string) is required")
        version = body.get("weight_version")
        result = await batcher.update_weights_from_disk(body["model_path"], None if version is None else str(version))
        return JSONResponse(result, status_code=200 if result["success"] else 400)

    app.add_api_route("/update_weights_from_tensor", sync.update_from_tensor, methods=["POST"])
    app.add_api_route("/init_weights_update_group", sync.init_group, methods=["POST"])
    app.add_api_route("/update_weights_from_distributed", sync.update_from_distributed, methods=["POST"])
    app.add_api_route("/destroy_weights_update_group", sync.destroy_group, methods=["POST"])
    app.add_api_route("/weights_checker", sync.weights_checker, methods=["GET", "POST"])

    return app


def main(argv: list[str] | None = None, preloaded: PreloadedModel | None = None) -> None:
    """`preloaded`: set when this engine was forked warm (slime.engine.warm_start); used if it is
    the checkpoint and dtype asked for."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--num-threads", type=int, default=None,
                    help="torch intra-op threads (default 1: robust when cores are shared)")
    ap.add_argument("--weight-version", default="default")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="bfloat16 roughly halves memory traffic on CPUs with avx512_bf16; float32 is exact")
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)

    mark("engine: main" + (" (forked warm)" if preloaded is not None else ""))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch
    import uvicorn

    dtype = getattr(torch, args.dtype)
    warm = preloaded if preloaded is not None and preloaded.matches(args.model_path, dtype) else None
    batcher = HFBatcher(args.model_path, max_batch_size=args.max_batch_size, num_threads=args.num_threads,
                        weight_version=args.weight_version, dtype=dtype, preloaded=warm)
    app = create_app(batcher, warm.server_tokenizer if warm else None)
    if warm is not None:
        logger.info("warm start: model and tokenizers preloaded by the fork server")
    mark("engine: model loaded")
    logger.info("serving %s on http://%s:%d", args.model_path, args.host, args.port)
    try:
        # Bounded graceful shutdown: a paused request would otherwise keep uvicorn waiting forever.
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower(), timeout_graceful_shutdown=3)
    finally:
        app.state.server.groups.destroy_all()
        batcher.shutdown()


if __name__ == "__main__":
    main()
