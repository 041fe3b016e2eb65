"""Continuous-batching generation core for the embedded CPU engine (transformers backend).

Why this shape:
- All torch work runs in ONE dedicated thread, so the asyncio loop of the HTTP server never
  blocks on a forward pass. Requests and control commands reach that thread through a
  thread-safe queue; results go back with `loop.call_soon_threadsafe`. When there is nothing to
  do the thread blocks on the queue (no polling).
- Requests join and leave between decode steps. A new request is prefilled on its own (so its
  prompt computation is identical to a solo run), then its KV cache is merged into the running
  batch: both sides are left-padded along the sequence axis to a common length and concatenated
  along the batch axis. Each row keeps its own attention mask and position ids, so padding
  never changes what a row attends to. Finished rows are dropped with `index_select`, and
  leading columns that are padding for every remaining row are trimmed.
- Sampling is per row: temperature (0 => greedy), top_k, top_p, min_new_tokens (stop tokens are
  masked until reached), and a per-request `torch.Generator` seeded by `sampling_seed`; draws use
  the exponential race (argmax p/E), so a seeded request gets the same tokens alone or batched.

Log-probs: for every sampled token we report log_softmax(logits / T)[token], computed from the
raw model logits BEFORE top-k / top-p truncation and before the min_new_tokens mask; T = 1 when
temperature is 0 (greedy). This is what an RL trainer recomputes with a
teacher-forced forward pass, so the two can be compared directly. Prompt tokens (SGLang's
`input_token_logprobs`, from `logprob_start_len`, default the last prompt token) are scored from the
same prefill at T = 1, as SGLang does unless it is patched to scale them; the first entry is None,
as in SGLang (so a teacher engine scores a whole sequence with `max_new_tokens: 0`).

Finish rules (checked after each token, in this order): a stop token (stop_token_ids, plus the
model's eos ids unless ignore_eos) => "stop" with the token id; a stop string found in the
decoded output => "stop" with the string (output_ids keep the token that completed it; `text`
is cut before it unless no_stop_trim); max_new_tokens reached => "length" (so a stop on the
last allowed token is reported as "stop"). Stop tokens and strings only count once
min_new_tokens tokens exist. Abort => "abort" with the tokens so far.

Weights: `release()` drops the model (and aborts in-flight requests, whose KV cache would be
meaningless) and `resume()` reloads it from `model_path`. Every weight change
(`update_weights_from_disk()`, which loads the checkpoint off the decode thread and swaps it in,
`apply_weights()` for tensors pushed by a trainer, `reset_tensors()`) happens between two decode
steps, so a step never sees half-updated weights. No answer mixes two versions: a request that
already has tokens from the old weights is restarted from its prompt with the new ones (its partial
output is discarded, never returned; the client just waits longer), so every request completes
entirely with one version, reported as `meta_info.weight_version` (and SGLang's
`meta_info.weight_versions` spans, always one). A streamed request cannot take back tokens it has
sent, so it is finished with finish_reason abort instead. Updates are serialised by a lock; a push
in several buckets should be bracketed by pause/continue (as slime's trainers do), so no request
runs on a half-pushed model.

Limits: models whose cache is a plain full-attention `DynamicCache` (Llama, Qwen2/3, Mistral
without sliding window, ...); no prefix cache (`cached_tokens` is always 0).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import os
import queue
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy
import torch

logger = logging.getLogger(__name__)

_STOP_WINDOW_EXTRA_TOKENS = 8  # decoded tail = longest stop string (in chars, an upper bound on tokens) + this


class EngineReleasedError(RuntimeError):
    """Raised for generation requests while the weights are released (the server answers 503)."""


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_new_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # accepted for compatibility; fast tokenizers ignore it
    no_stop_trim: bool = False
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0 or self.top_k == 1


@dataclass
class _Request:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    stream: asyncio.Queue | None
    created: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    generator: torch.Generator | None = None
    stop_ids: frozenset[int] = frozenset()
    done: bool = False
    weight_version: str = ""  # the version the request's tokens come from (set when prefilled)
    logprob_start_len: int = 0  # first prompt position reported in input_token_logprobs (return_logprob only)
    input_logprobs: list[float | None] = field(default_factory=list)


def _resolve(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _reject(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def load_model(path: str, dtype: torch.dtype):
    """The checkpoint as an inference-only module (eval mode, no grads)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    return model


@dataclass
class PreloadedModel:
    """A checkpoint loaded once before the engine processes exist (slime.engine.warm_start): each
    engine forked from that process starts with it, sharing the pages until it writes its own."""

    model_path: str
    dtype: torch.dtype
    model: Any
    tokenizer: Any  # the decode thread's
    server_tokenizer: Any  # the HTTP handlers' own instance (a tokenizer is not shared across threads)

    def matches(self, model_path: str, dtype: torch.dtype) -> bool:
        return os.path.realpath(model_path) == os.path.realpath(self.model_path) and dtype == self.dtype


class HFBatcher:
    """Owns the model, the running batch and the decode thread. Async methods are called from the server's loop."""

    def __init__(self, model_path: str, *, max_batch_size: int = 32, num_threads: int | None = None,
                 weight_version: str = "default", dtype: torch.dtype = torch.float32,
                 preloaded: "PreloadedModel | None" = None):
        """`preloaded`: model and tokenizer already in memory (a warm start), used when it is the
        same checkpoint and dtype; otherwise both are loaded from `model_path`."""
        from transformers import AutoTokenizer

        # Process-wide; the decode thread is the only heavy user. Default 1: engines share the machine with
        # trainers and other engines, and once cores are oversubscribed OpenMP's busy-waiting workers made
        # 2 threads 3-7x SLOWER than 1 on our 2-core boxes (while 2 threads on an idle box gain little:
        # decoding a 135M model is memory-bound).
        torch.set_num_threads(max(1, num_threads or 1))
        self.model_path = str(model_path)
        self.tokenizer_path = str(model_path)
        self.max_batch_size = max_batch_size
        self.weight_version = str(weight_version)
        self.dtype = dtype
        if preloaded is not None and preloaded.matches(self.model_path, dtype):
            self.tokenizer, self.model = preloaded.tokenizer, preloaded.model
        else:
            self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)  # used only by the decode thread
            self.model = self._load_model(self.model_path)
        cfg = self.model.config
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])
        self.context_length = int(getattr(cfg, "max_position_embeddings", 0) or 4096)
        self.eos_ids = self._eos_ids()
        self.released_tags: set[str] = set()
        # decode-thread state
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting: deque[_Request] = deque()
        self._rows: list[_Request] = []  # row i of the batch tensors
        self._cache = None  # DynamicCache for all rows, left-padded
        self._mask: torch.Tensor | None = None  # [B, T] 1 = real token
        self._next_pos: torch.Tensor | None = None  # [B] position id of the pending token
        self._pending: torch.Tensor | None = None  # [B] last sampled token, not yet in the cache
        self._paused = False
        self._rids: set[str] = set()  # in flight (asyncio side bookkeeping)
        self._weights_lock = asyncio.Lock()
        self.stats = {"requests_total": 0, "requests_finished": 0, "requests_aborted": 0, "prompt_tokens_total": 0,
                      "generated_tokens_total": 0, "decode_steps_total": 0, "prefills_total": 0,
                      "max_batch_size_seen": 0, "last_batch_size": 0, "requests_restarted": 0,
                      "weight_updates_total": 0}
        self._thread = threading.Thread(target=self._run, name="hf-decode", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ loading
    def _load_model(self, path: str):
        return load_model(path, self.dtype)

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for src in (self.model.config.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None),
                    self.tokenizer.eos_token_id):
            if isinstance(src, int):
                ids.add(src)
            elif src:
                ids.update(int(i) for i in src)
        return frozenset(ids)

    # ------------------------------------------------------------------ asyncio-side API
    @property
    def weights_loaded(self) -> bool:
        """The weights are in memory: they can be updated (slime's colocated order resumes
        `weights`, pushes new ones, and only then resumes `kv_cache`)."""
        return "weights" not in self.released_tags

    @property
    def serving(self) -> bool:
        """Everything released has been resumed: requests are admitted."""
        return not self.released_tags

    @property
    def paused(self) -> bool:
        return self._paused

    def load(self) -> dict[str, Any]:
        waiting = len(self._waiting)
        running = len(self._rows)
        return {"num_running_reqs": running, "num_waiting_reqs": waiting, "num_reqs": running + waiting,
                "num_tokens": sum(len(r.input_ids) + len(r.output_ids) for r in list(self._rows)),
                "decode_steps_total": self.stats["decode_steps_total"],
                "max_batch_size_seen": self.stats["max_batch_size_seen"], "paused": self._paused,
                "weights_released": not self.weights_loaded, "weight_version": self.weight_version,
                "requests_restarted": self.stats["requests_restarted"],
                "weight_updates_total": self.stats["weight_updates_total"]}

    def submit(self, input_ids: list[int], params: SamplingParams, *, rid: str | None = None,
               return_logprob: bool = False, logprob_start_len: int | None = None,
               stream: bool = False) -> tuple[str, asyncio.Future, asyncio.Queue | None]:
        """Queue a request; returns (rid, future of the final response dict, stream queue or None).

        A stream queue receives cumulative response dicts after each token and `None` at the end.
        `logprob_start_len` (with `return_logprob`): None or -1 = the last prompt token (SGLang's default).
        """
        start = len(input_ids) - 1 if logprob_start_len is None or logprob_start_len == -1 else logprob_start_len
        if not 0 <= start < len(input_ids):
            raise ValueError(f"logprob_start_len must be -1 or in [0, {len(input_ids)}) for a prompt of "
                             f"{len(input_ids)} tokens, got {logprob_start_len}")
        if not self.serving:
            raise EngineReleasedError(f"{sorted(self.released_tags)} released (release_memory_occupation); "
                                      "call resume_memory_occupation")
        rid = rid or uuid.uuid4().hex
        if rid in self._rids:
            raise ValueError(f"rid {rid!r} is already in flight")
        loop = asyncio.get_running_loop()
        req = _Request(rid=rid, input_ids=list(input_ids), params=params, return_logprob=return_logprob, loop=loop,
                       future=loop.create_future(), stream=asyncio.Queue() if stream else None,
                       logprob_start_len=start)
        self._rids.add(rid)
        req.future.add_done_callback(lambda _f: self._rids.discard(rid))
        self.stats["requests_total"] += 1
        self._inbox.put(("add", req))
        return rid, req.future, req.stream

    async def generate(self, input_ids: list[int], params: SamplingParams, **kw) -> dict:
        _, fut, _ = self.submit(input_ids, params, **kw)
        return await fut

    def abort(self, rid: str) -> None:
        self._inbox.put(("abort", rid))

    def abort_all(self) -> None:
        self._inbox.put(("abort_all", None))

    async def pause(self) -> None:
        """Stop running decode steps; returns once the decode thread has finished its current step."""
        self._paused = True
        await self._call("pause")

    def resume_generation(self) -> None:
        self._paused = False
        self._inbox.put(("continue", None))

    async def _call(self, op: str, arg: Any = None) -> Any:
        fut = asyncio.get_running_loop().create_future()
        self._inbox.put((op, (arg, fut)))
        return await fut

    async def release(self, tags: list[str] | None = None) -> None:
        """Free what `tags` names (default: weights and kv_cache). In-flight requests are aborted."""
        async with self._weights_lock:
            await self._call("release", set(tags or ("weights", "kv_cache")))

    async def resume(self, tags: list[str] | None = None) -> None:
        async with self._weights_lock:
            tags = set(tags or ("weights", "kv_cache"))
            model = None
            if "weights" in tags and self.model is None:
                model = await asyncio.to_thread(self._load_model, self.model_path)
            await self._call("resume", (tags, model))

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> dict:
        async with self._weights_lock:
            if not self.weights_loaded:
                return {"success": False, "message": "weights are released; resume_memory_occupation first"}
            try:
                model = await asyncio.to_thread(self._load_model, model_path)
            except Exception as exc:  # keep serving the old weights
                return {"success": False, "message": f"failed to load weights from {model_path}: {exc}"}
            if weight_version is None:
                weight_version = str(int(self.weight_version) + 1) if self.weight_version.isdigit() else "1"
            await self._call("swap", (model, model_path, str(weight_version)))
            return {"success": True, "message": "Succeeded to update model weights.",
                    "weight_version": self.weight_version, "num_paused_requests": 0}

    @property
    def weights_lock(self) -> asyncio.Lock:
        """Held by every weight change (and by a distributed receive), so updates never interleave."""
        return self._weights_lock

    async def apply_weights(self, named_tensors: list[tuple[str, torch.Tensor]],
                            weight_version: str | None = None) -> int:
        """Copy validated tensors into the served model between two decode steps (caller holds
        `weights_lock`); the version changes only when given. Returns how many requests restarted."""
        return await self._call("apply", (named_tensors, weight_version))

    async def write_weights(self, writer, weight_version: str | None = None) -> int:
        """Run `writer(tensor_table)` in the decode thread between two steps, so it can write the served
        parameters in place (e.g. receive a broadcast straight into them) while nothing decodes (caller
        holds `weights_lock`). In-flight requests restart; the version changes only if the writer succeeds."""
        return await self._call("write", (writer, weight_version))

    async def weight_checksums(self) -> dict[str, str]:
        """SHA-256 per tensor of the served weights, computed between two decode steps."""
        return await self._call("checksums")

    async def reset_tensors(self, seed: int | None = None) -> int:
        """Overwrite every weight with random values (SGLang's `reset_tensors`: proves a later push
        rewrites everything). The version is kept."""
        async with self._weights_lock:
            return await self._call("reset", seed)

    def shutdown(self) -> None:
        self._inbox.put(("stop", None))
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ decode thread
    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                idle = self._paused or not (self._rows or self._waiting)
                cmds = [self._inbox.get()] if idle else []
                while True:
                    try:
                        cmds.append(self._inbox.get_nowait())
                    except queue.Empty:
                        break
                for op, arg in cmds:
                    if op == "stop":
                        self._abort_everything("engine shutting down")
                        return
                    self._handle(op, arg)
                if self._paused:
                    continue
                try:
                    self._admit()
                    if self._rows:
                        self._decode_step()
                except Exception as exc:  # never let the thread die: fail the running batch, keep serving
                    logger.exception("decode step failed")
                    for req in self._rows:
                        self._fail(req, exc)
                    self._reset_batch()

    def _handle(self, op: str, arg: Any) -> None:
        if op == "add":
            self._waiting.append(arg)
        elif op == "abort":
            for req in [r for r in itertools.chain(self._rows, self._waiting) if r.rid == arg]:
                self._finish(req, {"type": "abort", "message": "Abort request."}, aborted=True)
            self._compact()
        elif op == "abort_all":
            self._abort_everything("Abort all requests.")
        elif op == "pause":
            self._paused = True
            _, fut = arg
            fut.get_loop().call_soon_threadsafe(_resolve, fut, None)
        elif op == "continue":
            self._paused = False
        elif op == "release":
            tags, fut = arg
            self._abort_everything("weights released")
            self.released_tags |= tags
            if "weights" in tags:
                self.model = None
                gc.collect()
            fut.get_loop().call_soon_threadsafe(_resolve, fut, None)
        elif op == "resume":
            (tags, model), fut = arg
            if model is not None:
                self.model = model
            self.released_tags -= tags
            fut.get_loop().call_soon_threadsafe(_resolve, fut, None)
        elif op == "swap":
            (model, path, version), fut = arg
            self.model, self.model_path, self.weight_version = model, path, version
            self._weights_changed()
            gc.collect()
            fut.get_loop().call_soon_threadsafe(_resolve, fut, None)
        elif op == "apply":
            (named, version), fut = arg
            self._reply(fut, self._apply, named, version)
        elif op == "write":
            (writer, version), fut = arg
            self._reply(fut, self._write, writer, version)
        elif op == "checksums":
            _, fut = arg
            self._reply(fut, self._checksums)
        elif op == "reset":
            seed, fut = arg
            self._reply(fut, self._reset_tensors, seed)

    def _reply(self, fut: asyncio.Future, fn, *args) -> None:
        try:
            result = fn(*args)
        except Exception as exc:  # noqa: BLE001 - reported to the caller, the thread keeps serving
            fut.get_loop().call_soon_threadsafe(_reject, fut, exc)
        else:
            fut.get_loop().call_soon_threadsafe(_resolve, fut, result)

    def _tensor_table(self) -> dict[str, torch.Tensor]:
        from slime.engine.weight_updates import model_tensors

        if self.model is None:
            raise EngineReleasedError("weights are released (release_memory_occupation)")
        return model_tensors(self.model)

    def _apply(self, named: list[tuple[str, torch.Tensor]], version: str | None) -> int:
        table = self._tensor_table()
        for name, t in named:  # validated by the caller; shapes/dtypes match
            table[name].copy_(t)
        if version is not None:
            self.weight_version = str(version)
        return self._weights_changed()

    def _write(self, writer, version: str | None) -> int:
        try:
            writer(self._tensor_table())
        except BaseException:
            self._weights_changed()  # possibly half-written: nothing may keep decoding on it unnoticed
            raise
        if version is not None:
            self.weight_version = str(version)
        return self._weights_changed()

    def _checksums(self) -> dict[str, str]:
        from slime.engine.weight_transfer import tensor_checksum

        return {name: tensor_checksum(t) for name, t in self._tensor_table().items()}

    def _reset_tensors(self, seed: int | None) -> int:
        gen = torch.Generator().manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
        for t in {id(t): t for t in self._tensor_table().values()}.values():
            if t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.dtype))
        return self._weights_changed()

    def _weights_changed(self) -> int:
        """Restart every running request from its prompt so none mixes two weight versions."""
        self.stats["weight_updates_total"] += 1
        restarted = 0
        for req in reversed(self._rows):
            if req.stream is not None:
                self._finish(req, {"type": "abort", "message": "weights were updated while this streamed request "
                                                               "was running; its tokens so far came from the old ones"},
                             aborted=True)
                continue
            req.output_ids, req.logprobs, req.input_logprobs, req.generator = [], [], [], None
            self._waiting.appendleft(req)
            restarted += 1
        self.stats["requests_restarted"] += restarted
        self._reset_batch()
        return restarted

    def _abort_everything(self, message: str) -> None:
        for req in list(self._rows) + list(self._waiting):
            self._finish(req, {"type": "abort", "message": message}, aborted=True)
        self._compact()

    def _reset_batch(self) -> None:
        self._rows, self._cache, self._mask, self._next_pos, self._pending = [], None, None, None, None

    # ---- admission: prefill one request alone, then merge its cache into the batch
    def _admit(self) -> None:
        while self._waiting and len(self._rows) < self.max_batch_size:
            req = self._waiting.popleft()
            if not self.serving:
                self._fail(req, EngineReleasedError(f"{sorted(self.released_tags)} released"))
                continue
            p = req.params
            req.weight_version = self.weight_version
            req.stop_ids = frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else self.eos_ids)
            seed = p.sampling_seed if p.sampling_seed is not None else int.from_bytes(os.urandom(8), "little")
            req.generator = torch.Generator().manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
            self.stats["prompt_tokens_total"] += len(req.input_ids)
            try:
                if p.max_new_tokens <= 0:  # nothing to sample; a scoring request still gets its prompt log-probs
                    if req.return_logprob:
                        self._score_prompt(req, use_cache=False)
                    self._finish(req, {"type": "length", "length": 0})
                    continue
                out = self._score_prompt(req, use_cache=True)
                token = self._sample_row(req, out.logits[0, -1].float())
            except Exception as exc:  # e.g. out of memory on a huge prompt: only this request fails
                logger.exception("prefill failed for %s", req.rid)
                self._fail(req, exc)
                continue
            self.stats["prefills_total"] += 1
            if self._append_token(req, token):
                continue  # finished on its first token: never joins the batch
            self._merge(req, out.past_key_values, len(req.input_ids), token)

    def _score_prompt(self, req: _Request, use_cache: bool):
        """The prefill forward. With `return_logprob` it keeps the logits from `logprob_start_len` on
        and records SGLang's `input_token_logprobs` values: None for the first reported token, then
        log_softmax(logits)[token] of each later prompt token given the tokens before it."""
        ids = req.input_ids
        if not req.return_logprob or req.logprob_start_len >= len(ids) - 1:
            if req.return_logprob:
                req.input_logprobs = [None]
            if not use_cache:
                return None  # nothing to compute: the one reported prompt token is always None
            return self.model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1)
        out = self.model(input_ids=torch.tensor([ids]), use_cache=use_cache,
                         logits_to_keep=len(ids) - req.logprob_start_len)
        req.input_logprobs = [None, *_token_logprobs(out.logits[0, :-1], ids[req.logprob_start_len + 1:])]
        return out

    def _merge(self, req: _Request, cache, length: int, token: int) -> None:
        mask = torch.ones(1, length, dtype=torch.long)
        pos = torch.tensor([length])
        tok = torch.tensor([token])
        if not self._rows:
            self._rows, self._cache, self._mask, self._next_pos, self._pending = [req], cache, mask, pos, tok
            return
        total = max(self._mask.shape[1], length)
        pad_old, pad_new = total - self._mask.shape[1], total - length
        for old_layer, new_layer in zip(self._cache.layers, cache.layers):
            for name in ("keys", "values"):
                a = _left_pad(getattr(old_layer, name), pad_old, dim=2)
                b = _left_pad(getattr(new_layer, name), pad_new, dim=2)
                setattr(old_layer, name, torch.cat([a, b], dim=0))
        self._mask = torch.cat([_left_pad(self._mask, pad_old, dim=1), _left_pad(mask, pad_new, dim=1)], dim=0)
        self._next_pos = torch.cat([self._next_pos, pos])
        self._pending = torch.cat([self._pending, tok])
        self._rows.append(req)

    # ---- one decode step for every running row
    def _decode_step(self) -> None:
        bsz = len(self._rows)
        mask = torch.cat([self._mask, torch.ones(bsz, 1, dtype=torch.long)], dim=1)
        out = self.model(input_ids=self._pending[:, None], attention_mask=mask, position_ids=self._next_pos[:, None],
                         past_key_values=self._cache, use_cache=True)
        self._cache, self._mask, self._next_pos = out.past_key_values, mask, self._next_pos + 1
        self.stats["decode_steps_total"] += 1
        self.stats["last_batch_size"] = bsz
        self.stats["max_batch_size_seen"] = max(self.stats["max_batch_size_seen"], bsz)
        logits = out.logits[:, -1].float()
        for i, req in enumerate(self._rows):
            token = self._sample_row(req, logits[i])
            self._pending[i] = token
            self._append_token(req, token)
        self._compact()

    def _compact(self) -> None:
        """Drop finished rows from the batch tensors and trim all-padding leading columns."""
        if not self._rows:
            return
        keep = [i for i, r in enumerate(self._rows) if not r.done]
        if len(keep) == len(self._rows):
            return
        if not keep:
            self._reset_batch()
            return
        idx = torch.tensor(keep)
        self._rows = [self._rows[i] for i in keep]
        self._mask, self._next_pos, self._pending = self._mask[idx], self._next_pos[idx], self._pending[idx]
        start = int(self._mask.any(dim=0).long().argmax())
        self._mask = self._mask[:, start:]
        for layer in self._cache.layers:
            layer.keys = layer.keys.index_select(0, idx)[:, :, start:]
            layer.values = layer.values.index_select(0, idx)[:, :, start:]

    # ---- sampling
    def _sample_row(self, req: _Request, logits: torch.Tensor) -> int:
        p = req.params
        scaled = logits / p.temperature if p.temperature > 0 else logits  # also the log-prob distribution
        masked = scaled
        if len(req.output_ids) < p.min_new_tokens and req.stop_ids:
            masked = scaled.clone()
            masked[[i for i in req.stop_ids if 0 <= i < masked.shape[0]]] = float("-inf")
        if p.greedy:
            token = int(torch.argmax(masked))
        else:
            if 0 < p.top_k < masked.shape[0]:
                kth = torch.topk(masked, p.top_k).values[-1]
                masked = masked.masked_fill(masked < kth, float("-inf"))
            probs = torch.softmax(masked, dim=-1)
            if p.top_p < 1.0:
                probs = probs.masked_fill(probs < _top_p_threshold(probs, p.top_p), 0.0)
            # Exponential race: argmax(p_i / E_i), E_i ~ Exp(1), draws i with probability p_i. Unlike an
            # inverse-CDF draw, a 1e-7 change in the logits (batched vs solo kernels) almost never flips
            # the winner, so a seeded request samples the same tokens alone or in a batch.
            # -log U ~ Exp(1) (torch's exponential_ is ~6x slower than rand on CPU). U < 1, so the noise is
            # > 0 and p / noise is never NaN; U == 0 gives inf noise, i.e. that token simply loses.
            noise = torch.rand(probs.shape, generator=req.generator).log_().neg_()
            token = int(torch.argmax(probs / noise))
        if req.return_logprob:
            req.logprobs.append(float(torch.log_softmax(scaled, dim=-1)[token]))
        return token

    # ---- finishing
    def _append_token(self, req: _Request, token: int) -> bool:
        """Record a sampled token; finish the request if it is done. Returns True when finished."""
        req.output_ids.append(token)
        self.stats["generated_tokens_total"] += 1
        p = req.params
        n = len(req.output_ids)
        reason = None
        if n >= p.min_new_tokens:
            if token in req.stop_ids:
                reason = {"type": "stop", "matched": token}
            elif p.stop:
                window = max(len(s) for s in p.stop) + _STOP_WINDOW_EXTRA_TOKENS
                # special tokens kept, so a stop string such as "<|im_end|>" can match too
                tail = self.tokenizer.decode(req.output_ids[-window:], skip_special_tokens=False)
                for s in p.stop:
                    if s and s in tail:
                        reason = {"type": "stop", "matched": s}
                        break
        if reason is None and n >= p.max_new_tokens:
            reason = {"type": "length", "length": p.max_new_tokens}
        if reason is not None:
            self._finish(req, reason)
            return True
        if req.stream is not None:
            req.loop.call_soon_threadsafe(req.stream.put_nowait, self._response(req, None))
        return False

    def _finish(self, req: _Request, reason: dict, aborted: bool = False) -> None:
        req.done = True
        try:
            self._waiting.remove(req)
        except ValueError:
            pass
        self.stats["requests_finished"] += 1
        self.stats["requests_aborted"] += int(aborted)
        resp = self._response(req, reason)
        req.loop.call_soon_threadsafe(_resolve, req.future, resp)
        if req.stream is not None:
            req.loop.call_soon_threadsafe(req.stream.put_nowait, resp)
            req.loop.call_soon_threadsafe(req.stream.put_nowait, None)

    def _fail(self, req: _Request, exc: BaseException) -> None:
        req.done = True
        req.loop.call_soon_threadsafe(_reject, req.future, exc)
        if req.stream is not None:
            req.loop.call_soon_threadsafe(req.stream.put_nowait, None)

    def _response(self, req: _Request, reason: dict | None) -> dict:
        p = req.params
        ids = req.output_ids
        version = req.weight_version or self.weight_version  # "" only if never prefilled (e.g. aborted while waiting)
        text = self.tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens)
        if reason and reason["type"] == "stop" and not p.no_stop_trim:
            if isinstance(reason["matched"], str):
                cut = text.find(reason["matched"])
                text = text[:cut] if cut >= 0 else text
            else:
                text = self.tokenizer.decode(ids[:-1], skip_special_tokens=p.skip_special_tokens)
        meta = {"id": req.rid, "finish_reason": reason, "prompt_tokens": len(req.input_ids),
                "completion_tokens": len(ids), "cached_tokens": 0, "weight_version": version,
                "weight_versions": [{"version": version, "start": 0, "end": len(ids)}],
                "e2e_latency": time.monotonic() - req.created}
        if req.return_logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(req.logprobs, ids)]
            # empty only if the request never reached its prefill (aborted while waiting)
            scored = req.input_ids[req.logprob_start_len:]
            meta["input_token_logprobs"] = [[lp, t, None] for lp, t in zip(req.input_logprobs, scored)]
        return {"text": text, "output_ids": list(ids), "meta_info": meta}


_SCORE_CHUNK_ROWS = 256  # rows of vocabulary-sized log-softmax at a time when scoring a long prompt


def _token_logprobs(logits: torch.Tensor, targets: list[int]) -> list[float]:
    """log_softmax(logits[i])[targets[i]] per row, in float32, a chunk of rows at a time."""
    out: list[float] = []
    target = torch.tensor(targets)
    for lo in range(0, len(targets), _SCORE_CHUNK_ROWS):
        rows = torch.log_softmax(logits[lo:lo + _SCORE_CHUNK_ROWS].float(), dim=-1)
        out += rows.gather(-1, target[lo:lo + _SCORE_CHUNK_ROWS, None])[:, 0].tolist()
    return out


def _top_p_threshold(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Smallest probability kept by nucleus sampling: the top tokens whose mass first reaches top_p.

    Tries the 1024 most likely tokens first (enough for any peaked distribution) and only sorts
    the whole vocabulary for flat ones; a full torch.sort costs tens of ms per row on 2 cores.
    """
    k = min(1024, probs.shape[0])
    top = torch.topk(probs, k).values
    csum = torch.cumsum(top, 0)
    if float(csum[-1]) < top_p and k < probs.shape[0]:
        top = torch.from_numpy(numpy.sort(probs.numpy())[::-1].copy())
        csum = torch.cumsum(top, 0)
    n = min(int(torch.searchsorted(csum, torch.tensor([top_p]))), top.shape[0] - 1)
    return top[n]


def _left_pad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n == 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)
