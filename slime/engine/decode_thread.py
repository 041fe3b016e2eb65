"""The embedded engine's decode thread: the one thread that runs torch, so the HTTP server's event
loop never blocks on a forward pass.

Requests and commands arrive on a thread-safe queue; with nothing to decode the thread blocks on it (no
polling). Between two decode steps it applies every queued command, admits waiting requests (a solo
prefill each, then a merge into the running batch) and runs one batched step. Weight changes happen only
there, so a step never sees half-updated weights, and no answer mixes two versions: a request that
already has tokens from the old weights restarts from its prompt (its partial output is discarded, never
returned); a streamed one cannot take back what it sent, so it is finished with finish_reason abort.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import queue
import threading
from collections import deque
from typing import Any, Callable

import torch

from slime.engine.finish_rules import finish_reason, stop_ids
from slime.engine.prefill import prefill
from slime.engine.request import EngineReleasedError, Request, reject_threadsafe, resolve_threadsafe
from slime.engine.response import build_response
from slime.engine.running_batch import RunningBatch
from slime.engine.sampling import sample_token, sampled_logprob, seeded_generator, top_logprobs
from slime.engine.weight_edits import copy_tensors, randomize_tensors, served_tensors, tensor_checksums

logger = logging.getLogger(__name__)

_STATS = (
    "requests_total",
    "requests_finished",
    "requests_aborted",
    "prompt_tokens_total",
    "generated_tokens_total",
    "decode_steps_total",
    "prefills_total",
    "max_batch_size_seen",
    "last_batch_size",
    "requests_restarted",
    "weight_updates_total",
)


class DecodeThread:
    """Owns the served model, the waiting queue and the running batch. Its fields are written by its
    thread only (except `paused`, which `HFBatcher.pause` also sets at once); others post commands."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_path: str,
        weight_version: str,
        max_batch_size: int,
        eos_ids: frozenset[int],
    ):
        self.model, self.tokenizer, self.model_path, self.weight_version = model, tokenizer, model_path, weight_version
        self.max_batch_size, self.eos_ids = max_batch_size, eos_ids
        self.released_tags: set[str] = set()
        self.paused = False
        self.stats = dict.fromkeys(_STATS, 0)
        self.waiting: deque[Request] = deque()
        self.batch = RunningBatch()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._calls: dict[str, Callable[..., Any]] = {
            "pause": self._pause,
            "release": self._release,
            "resume": self._resume,
            "swap": self._swap,
            "apply": self._apply,
            "write": self._write,
            "checksums": self._checksums,
            "reset": self._reset_tensors,
        }
        self._notices: dict[str, Callable[[Any], None]] = {
            "add": self.waiting.append,
            "abort": self._abort,
            "abort_all": self._abort_all,
            "continue": self._continue,
        }
        self._thread = threading.Thread(target=self._run, name="hf-decode", daemon=True)
        self._thread.start()

    @property
    def serving(self) -> bool:
        return not self.released_tags

    # ------------------------------------------------------------------ other threads
    def post(self, op: str, arg: Any = None) -> None:
        """A command with no answer: add, abort (a rid), abort_all, continue."""
        self._inbox.put((op, arg))

    async def call(self, op: str, *args: Any) -> Any:
        """Run `op` between two decode steps and await its result (or its exception)."""
        fut = asyncio.get_running_loop().create_future()
        self._inbox.put((op, (args, fut)))
        return await fut

    def stop(self, timeout: float) -> None:
        self._inbox.put(("stop", None))
        self._thread.join(timeout=timeout)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                for op, arg in self._commands():
                    if op == "stop":
                        self._abort_everything("engine shutting down")
                        return
                    self._handle(op, arg)
                if not self.paused:
                    self._step()

    def _commands(self) -> list[tuple[str, Any]]:
        """Every queued command; blocks for the first one when there is nothing to decode."""
        idle = self.paused or not (self.batch.rows or self.waiting)
        cmds = [self._inbox.get()] if idle else []
        while True:
            try:
                cmds.append(self._inbox.get_nowait())
            except queue.Empty:
                return cmds

    def _handle(self, op: str, arg: Any) -> None:
        if op in self._notices:
            self._notices[op](arg)
            return
        args, fut = arg
        try:
            result = self._calls[op](*args)
        except Exception as exc:  # noqa: BLE001 - reported to the caller, the thread keeps serving
            reject_threadsafe(fut, exc)
        else:
            resolve_threadsafe(fut, result)

    def _step(self) -> None:
        try:
            self._admit()
            if self.batch.rows:
                self._decode_step()
        except Exception as exc:  # never let the thread die: fail the running batch, keep serving
            logger.exception("decode step failed")
            for req in self.batch.rows:
                req.send_error(exc)
            self.batch.clear()

    # ---- admission: prefill one request alone, then merge its cache into the batch
    def _admit(self) -> None:
        while self.waiting and len(self.batch.rows) < self.max_batch_size:
            req = self.waiting.popleft()
            if not self.serving:
                req.send_error(EngineReleasedError(f"{sorted(self.released_tags)} released"))
                continue
            self._prefill(req)

    def _prefill(self, req: Request) -> None:
        p = req.params
        req.weight_version = self.weight_version
        req.stop_ids = stop_ids(p.stop_token_ids, p.ignore_eos, self.eos_ids)
        req.generator = seeded_generator(p.sampling_seed)
        self.stats["prompt_tokens_total"] += len(req.input_ids)
        try:
            if p.max_new_tokens <= 0:  # nothing to sample; a scoring request still gets its prompt log-probs
                if req.return_logprob:
                    prefill(self.model, req, use_cache=False)
                self._finish(req, {"type": "length", "length": 0})
                return
            out = prefill(self.model, req, use_cache=True)
            token = self._sample(req, out.logits[0, -1].float())
        except Exception as exc:  # e.g. out of memory on a huge prompt: only this request fails
            logger.exception("prefill failed for %s", req.rid)
            req.send_error(exc)
            return
        self.stats["prefills_total"] += 1
        if not self._append_token(req, token):  # a request finished on its first token never joins the batch
            self.batch.add(req, out.past_key_values, len(req.input_ids), token)

    # ---- one decode step for every running row
    def _decode_step(self) -> None:
        bsz = len(self.batch.rows)
        logits = self.batch.forward(self.model)
        self.stats["decode_steps_total"] += 1
        self.stats["last_batch_size"] = bsz
        self.stats["max_batch_size_seen"] = max(self.stats["max_batch_size_seen"], bsz)
        for i, req in enumerate(self.batch.rows):
            token = self._sample(req, logits[i])
            self.batch.pending[i] = token
            self._append_token(req, token)
        self.batch.drop_finished()

    def _sample(self, req: Request, logits: torch.Tensor) -> int:
        banned = req.stop_ids if len(req.output_ids) < req.params.min_new_tokens else ()
        token = sample_token(logits, req.params, req.generator, banned)
        if req.return_logprob:
            req.logprobs.append(sampled_logprob(logits, req.params, token))
            if req.top_logprobs_num:
                req.top_logprobs.append(top_logprobs(logits, req.params, req.top_logprobs_num))
        return token

    # ---- finishing
    def _append_token(self, req: Request, token: int) -> bool:
        """Record a sampled token; finish the request if it is done. Returns True when finished."""
        req.output_ids.append(token)
        self.stats["generated_tokens_total"] += 1
        reason = finish_reason(req, self.tokenizer)
        if reason is not None:
            self._finish(req, reason)
            return True
        if req.stream is not None:
            req.send_partial(build_response(req, None, self.tokenizer, self.weight_version))
        return False

    def _finish(self, req: Request, reason: dict, aborted: bool = False) -> None:
        try:
            self.waiting.remove(req)
        except ValueError:
            pass
        self.stats["requests_finished"] += 1
        self.stats["requests_aborted"] += int(aborted)
        req.send_final(build_response(req, reason, self.tokenizer, self.weight_version))

    def _abort(self, rid: str) -> None:
        for req in [r for r in itertools.chain(self.batch.rows, self.waiting) if r.rid == rid]:
            self._finish(req, {"type": "abort", "message": "Abort request."}, aborted=True)
        self.batch.drop_finished()

    def _abort_all(self, _: Any) -> None:
        self._abort_everything("Abort all requests.")

    def _abort_everything(self, message: str) -> None:
        for req in list(self.batch.rows) + list(self.waiting):
            self._finish(req, {"type": "abort", "message": message}, aborted=True)
        self.batch.drop_finished()

    # ---- control between two steps
    def _pause(self) -> None:
        self.paused = True

    def _continue(self, _: Any) -> None:
        self.paused = False

    def _release(self, tags: set[str]) -> None:
        self._abort_everything("weights released")
        self.released_tags |= tags
        if "weights" in tags:
            self.model = None
            gc.collect()

    def _resume(self, tags: set[str], model: Any) -> None:
        if model is not None:
            self.model = model
        self.released_tags -= tags

    def _swap(self, model: Any, path: str, version: str) -> None:
        self.model, self.model_path, self.weight_version = model, path, version
        self._weights_changed()
        gc.collect()

    def _apply(self, named: list[tuple[str, torch.Tensor]], version: str | None) -> int:
        copy_tensors(served_tensors(self.model), named)
        return self._new_weights(version)

    def _write(self, writer: Callable[[dict[str, torch.Tensor]], Any], version: str | None) -> int:
        try:
            writer(served_tensors(self.model))
        except BaseException:
            self._weights_changed()  # possibly half-written: nothing may keep decoding on it unnoticed
            raise
        return self._new_weights(version)

    def _checksums(self) -> dict[str, str]:
        return tensor_checksums(served_tensors(self.model))

    def _reset_tensors(self, seed: int | None) -> int:
        randomize_tensors(served_tensors(self.model), seed)
        return self._weights_changed()

    def _new_weights(self, version: str | None) -> int:
        if version is not None:
            self.weight_version = str(version)
        return self._weights_changed()

    def _weights_changed(self) -> int:
        """Restart every running request from its prompt so none mixes two weight versions."""
        self.stats["weight_updates_total"] += 1
        restarted = 0
        for req in reversed(self.batch.rows):
            if req.stream is not None:
                self._finish(
                    req,
                    {
                        "type": "abort",
                        "message": "weights were updated while this streamed request "
                        "was running; its tokens so far came from the old ones",
                    },
                    aborted=True,
                )
                continue
            req.forget_output()
            self.waiting.appendleft(req)
            restarted += 1
        self.stats["requests_restarted"] += restarted
        self.batch.clear()
        return restarted
