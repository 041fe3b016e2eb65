"""Continuous-batching generation for the embedded CPU engine (transformers backend): `HFBatcher`, the
asyncio-side handle the HTTP server calls.

The engine's parts, one file each: `decode_thread` (the one torch thread: admission, decode steps,
weight changes between steps), `running_batch` (the shared left-padded KV cache), `prefill` (solo
prompt forward and prompt log-probs), `sampling` (per-row sampling and the reported log-probs),
`finish_rules` (stop / length), `response` (SGLang's answer), `request` (a request's state and how its
answer reaches the event loop), `model_loading`, `weight_edits`.

Limits: models whose cache is a plain full-attention `DynamicCache` (Llama, Qwen2/3, Mistral without
sliding window, Qwen2-VL / Qwen2.5-VL with images, ...); no prefix cache (`cached_tokens` is always 0).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Callable

import torch

from slime.engine.decode_thread import DecodeThread
from slime.engine.image_inputs import ImageInputs
from slime.engine.model_loading import PreloadedModel, eos_token_ids, load_model
from slime.engine.request import EngineReleasedError, Request
from slime.engine.sampling import SamplingParams
from slime.utils.processing_utils import load_processor, load_tokenizer
from slime.utils.vision_model import image_token_id, is_vision_model

__all__ = ["EngineReleasedError", "HFBatcher", "PreloadedModel", "SamplingParams", "load_model"]

logger = logging.getLogger(__name__)
_DEFAULT_RELEASE_TAGS = ("weights", "kv_cache")
_SHUTDOWN_JOIN_SECONDS = 10


class HFBatcher:
    """Owns the decode thread and the request bookkeeping of the event loop. Async methods are called
    from the server's loop; every change to the model or the batch is a command run by the decode thread."""

    def __init__(
        self,
        model_path: str,
        *,
        max_batch_size: int = 32,
        num_threads: int | None = None,
        weight_version: str = "default",
        dtype: torch.dtype = torch.float32,
        preloaded: "PreloadedModel | None" = None,
    ):
        """`preloaded`: model and tokenizer already in memory (a warm start), used when it is the
        same checkpoint and dtype; otherwise both are loaded from `model_path`."""
        # Process-wide; the decode thread is the only heavy user. Default 1: engines share the machine with
        # trainers and other engines, and once cores are oversubscribed OpenMP's busy-waiting workers made
        # 2 threads 3-7x SLOWER than 1 on our 2-core boxes (while 2 threads on an idle box gain little:
        # decoding a 135M model is memory-bound).
        torch.set_num_threads(max(1, num_threads or 1))
        self.tokenizer_path = str(model_path)
        self.max_batch_size = max_batch_size
        self.dtype = dtype
        if preloaded is not None and preloaded.matches(str(model_path), dtype):
            self.tokenizer, model = preloaded.tokenizer, preloaded.model
        else:
            self.tokenizer = load_tokenizer(self.tokenizer_path)  # used only by the decode thread
            model = self._load_model(str(model_path))
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.context_length = int(getattr(model.config, "max_position_embeddings", 0) or 4096)
        self.eos_ids = eos_token_ids(model, self.tokenizer)
        self.image_inputs = self._image_inputs(model, str(model_path))
        self._rids: set[str] = set()  # in flight (asyncio side bookkeeping)
        self._weights_lock = asyncio.Lock()
        self._decode = DecodeThread(
            model,
            self.tokenizer,
            model_path=str(model_path),
            weight_version=str(weight_version),
            max_batch_size=max_batch_size,
            eos_ids=self.eos_ids,
        )

    def _load_model(self, path: str):
        return load_model(path, self.dtype)

    @staticmethod
    def _image_inputs(model: Any, path: str) -> ImageInputs | None:
        """A vision-language model's image side (its processor's image processor), else None (no images)."""
        if not is_vision_model(model):
            return None
        processor = load_processor(path)
        if processor is None or getattr(processor, "image_processor", None) is None:
            logger.warning("%s has a vision tower but no image processor: image_data will be refused", path)
            return None
        return ImageInputs(processor, image_token_id(model))

    # ------------------------------------------------------------------ state (owned by the decode thread)
    @property
    def model(self) -> Any:
        return self._decode.model

    @property
    def model_path(self) -> str:
        return self._decode.model_path

    @property
    def weight_version(self) -> str:
        return self._decode.weight_version

    @property
    def released_tags(self) -> set[str]:
        return self._decode.released_tags

    @property
    def stats(self) -> dict[str, int]:
        return self._decode.stats

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
        return self._decode.paused

    def load(self) -> dict[str, Any]:
        rows, waiting, stats = list(self._decode.batch.rows), len(self._decode.waiting), self.stats
        return {
            "num_running_reqs": len(rows),
            "num_waiting_reqs": waiting,
            "num_reqs": len(rows) + waiting,
            "num_tokens": sum(len(r.input_ids) + len(r.output_ids) for r in rows),
            "decode_steps_total": stats["decode_steps_total"],
            "max_batch_size_seen": stats["max_batch_size_seen"],
            "paused": self.paused,
            "weights_released": not self.weights_loaded,
            "weight_version": self.weight_version,
            "requests_restarted": stats["requests_restarted"],
            "weight_updates_total": stats["weight_updates_total"],
        }

    # ------------------------------------------------------------------ generation
    def submit(
        self,
        input_ids: list[int],
        params: SamplingParams,
        *,
        rid: str | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        stream: bool = False,
        top_logprobs_num: int = 0,
        images: dict[str, torch.Tensor] | None = None,
    ) -> tuple[str, asyncio.Future, asyncio.Queue | None]:
        """Queue a request; returns (rid, future of the final response dict, stream queue or None).

        A stream queue receives cumulative response dicts after each token and `None` at the end.
        `logprob_start_len` (with `return_logprob`): None or -1 = the last prompt token (SGLang's default);
        `top_logprobs_num` (with `return_logprob`): the k most likely tokens reported at each sampled position.
        `images`: a vision-language model's pixel_values and image_grid_thw for the image tokens of `input_ids`.
        """
        start = len(input_ids) - 1 if logprob_start_len is None or logprob_start_len == -1 else logprob_start_len
        if not 0 <= start < len(input_ids):
            raise ValueError(
                f"logprob_start_len must be -1 or in [0, {len(input_ids)}) for a prompt of "
                f"{len(input_ids)} tokens, got {logprob_start_len}"
            )
        if not self.serving:
            raise EngineReleasedError(
                f"{sorted(self.released_tags)} released (release_memory_occupation); call resume_memory_occupation"
            )
        rid = rid or uuid.uuid4().hex
        if rid in self._rids:
            raise ValueError(f"rid {rid!r} is already in flight")
        loop = asyncio.get_running_loop()
        req = Request(
            rid=rid,
            input_ids=list(input_ids),
            params=params,
            return_logprob=return_logprob,
            loop=loop,
            future=loop.create_future(),
            stream=asyncio.Queue() if stream else None,
            logprob_start_len=start,
            top_logprobs_num=top_logprobs_num if return_logprob else 0,
            images=images,
        )
        self._rids.add(rid)
        req.future.add_done_callback(lambda _f: self._rids.discard(rid))
        self.stats["requests_total"] += 1
        self._decode.post("add", req)
        return rid, req.future, req.stream

    async def generate(self, input_ids: list[int], params: SamplingParams, **kw) -> dict:
        _, fut, _ = self.submit(input_ids, params, **kw)
        return await fut

    def abort(self, rid: str) -> None:
        self._decode.post("abort", rid)

    def abort_all(self) -> None:
        self._decode.post("abort_all")

    async def pause(self) -> None:
        """Stop running decode steps; returns once the decode thread has finished its current step."""
        self._decode.paused = True
        await self._decode.call("pause")

    def resume_generation(self) -> None:
        self._decode.paused = False
        self._decode.post("continue")

    # ------------------------------------------------------------------ memory and weights
    async def release(self, tags: list[str] | None = None) -> None:
        """Free what `tags` names (default: weights and kv_cache). In-flight requests are aborted, since
        their KV cache would be meaningless; `resume()` reloads the weights from `model_path`."""
        async with self._weights_lock:
            await self._decode.call("release", set(tags or _DEFAULT_RELEASE_TAGS))

    async def resume(self, tags: list[str] | None = None) -> None:
        async with self._weights_lock:
            tags = set(tags or _DEFAULT_RELEASE_TAGS)
            model = None
            if "weights" in tags and self.model is None:
                model = await asyncio.to_thread(self._load_model, self.model_path)
            await self._decode.call("resume", tags, model)

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> dict:
        """Loads the checkpoint off the decode thread, then swaps it in between two steps."""
        async with self._weights_lock:
            if not self.weights_loaded:
                return {"success": False, "message": "weights are released; resume_memory_occupation first"}
            try:
                model = await asyncio.to_thread(self._load_model, model_path)
            except Exception as exc:  # keep serving the old weights
                return {"success": False, "message": f"failed to load weights from {model_path}: {exc}"}
            if weight_version is None:
                weight_version = str(int(self.weight_version) + 1) if self.weight_version.isdigit() else "1"
            await self._decode.call("swap", model, model_path, str(weight_version))
            return {
                "success": True,
                "message": "Succeeded to update model weights.",
                "weight_version": self.weight_version,
                "num_paused_requests": 0,
            }

    @property
    def weights_lock(self) -> asyncio.Lock:
        """Held by every weight change (and by a distributed receive), so updates never interleave. A push
        in several buckets should be bracketed by pause/continue (as slime's trainers do), so no request
        runs on a half-pushed model."""
        return self._weights_lock

    async def apply_weights(
        self, named_tensors: list[tuple[str, torch.Tensor]], weight_version: str | None = None
    ) -> int:
        """Copy validated tensors into the served model between two decode steps (caller holds
        `weights_lock`); the version changes only when given. Returns how many requests restarted."""
        return await self._decode.call("apply", named_tensors, weight_version)

    async def write_weights(
        self, writer: Callable[[dict[str, torch.Tensor]], Any], weight_version: str | None = None
    ) -> int:
        """Run `writer(tensor_table)` in the decode thread between two steps, so it can write the served
        parameters in place (e.g. receive a broadcast straight into them) while nothing decodes (caller
        holds `weights_lock`). In-flight requests restart; the version changes only if the writer succeeds."""
        return await self._decode.call("write", writer, weight_version)

    async def weight_checksums(self) -> dict[str, str]:
        """SHA-256 per tensor of the served weights, computed between two decode steps."""
        return await self._decode.call("checksums")

    async def reset_tensors(self, seed: int | None = None) -> int:
        """Overwrite every weight with random values (SGLang's `reset_tensors`: proves a later push
        rewrites everything). The version is kept."""
        async with self._weights_lock:
            return await self._decode.call("reset", seed)

    def shutdown(self) -> None:
        self._decode.stop(timeout=_SHUTDOWN_JOIN_SECONDS)
