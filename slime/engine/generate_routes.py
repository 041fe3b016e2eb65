"""`/generate` (one input or a batch, answered whole or streamed as server-sent events) and
`/health_generate`. Handlers only validate, enqueue and await: all model work happens in the decode thread.
A batch is submitted all or nothing, and requests whose client went away are aborted, so nothing keeps
decoding for nobody. `image_data` (a vision-language model's images, SGLang's field) is read by `image_inputs`."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from slime.engine.batcher import EngineReleasedError, HFBatcher, SamplingParams
from slime.engine.http_errors import error_response, released_response
from slime.engine.image_inputs import images_per_input
from slime.engine.request_parsing import BadRequest, GenerateBody, generation_body, parse_generate_body
from slime.utils.client_gone import client_gone

Submitted = tuple[str, asyncio.Future, "asyncio.Queue | None"]  # what HFBatcher.submit returns


class GenerateRoutes:
    def __init__(self, batcher: HFBatcher, tokenizer: Any):
        """`tokenizer`: the handlers' own instance (the batcher's is used concurrently by the decode thread)."""
        self.batcher, self.tokenizer = batcher, tokenizer

    async def generate(self, request: Request) -> Response:
        body = await generation_body(request)
        if isinstance(body, JSONResponse):
            return body
        if not self.batcher.serving:
            return released_response()
        try:
            parsed = parse_generate_body(body, self.tokenizer, self.batcher.vocab_size, self.batcher.context_length)
            images = await self._images(body, parsed)
            submitted = self._submit_all(parsed, images)
        except BadRequest as exc:
            return error_response(400, str(exc))
        except EngineReleasedError:
            return released_response()
        except ValueError as exc:  # e.g. duplicate rid
            return error_response(400, str(exc))
        if parsed.stream:
            rid, fut, chunks = submitted[0]
            return StreamingResponse(self._sse(rid, fut, chunks), media_type="text/event-stream")
        return await self._answer(request, submitted, parsed.batch)

    async def _images(self, body: dict, parsed: GenerateBody) -> list[dict | None]:
        """Per input: its prompt's placeholders expanded in place and its image tensors (None: no images).
        A model without a vision tower refuses `image_data`."""
        per_input = images_per_input(body.get("image_data"), len(parsed.prompts), parsed.batch)
        if not any(per_input):
            return [None] * len(parsed.prompts)
        vision = self.batcher.image_inputs
        if vision is None:
            raise BadRequest(
                f"image_data: the served model ({self.batcher.model_path}) takes no images (no vision "
                "tower, or no image processor beside it); it takes text and token ids only"
            )
        out: list[dict | None] = []
        for i, items in enumerate(per_input):
            if not items:
                out.append(None)
                continue
            where = f"image_data[{i}]" if parsed.batch else "image_data"
            ids, tensors = await asyncio.to_thread(vision.prepare, parsed.prompts[i], items, where)
            ctx = self.batcher.context_length
            if len(ids) >= ctx:
                raise BadRequest(
                    f"input_ids is too long with its images: {len(ids)} tokens, the model's context length is {ctx}"
                )
            parsed.prompts[i] = ids
            parsed.params[i].max_new_tokens = min(parsed.params[i].max_new_tokens, ctx - len(ids))
            out.append(tensors)
        return out

    def _submit_all(self, parsed: GenerateBody, images: list[dict | None] | None = None) -> list[Submitted]:
        """Each prompt to the batcher (with its images: None for text, the OpenAI routes' case)."""
        images = images if images is not None else [None] * len(parsed.prompts)
        submitted: list[Submitted] = []
        try:
            for p, sp, r, lp, start, top, mm in zip(
                parsed.prompts,
                parsed.params,
                parsed.rids,
                parsed.return_logprob,
                parsed.logprob_start_lens,
                parsed.top_logprobs_nums,
                images,
            ):
                submitted.append(
                    self.batcher.submit(
                        p,
                        sp,
                        rid=r,
                        return_logprob=lp,
                        logprob_start_len=start,
                        stream=parsed.stream,
                        top_logprobs_num=top,
                        images=mm,
                    )
                )
        except Exception:  # all or nothing: do not leave half a batch decoding for nobody
            for r, _, _ in submitted:
                self.batcher.abort(r)
            raise
        return submitted

    async def _answer(self, request: Request, submitted: list[Submitted], batch: bool) -> Response:
        results = await self.results(request, submitted)
        if isinstance(results, Response):
            return results
        return JSONResponse(results if batch else results[0])

    async def results(self, request: Request, submitted: list[Submitted]) -> list[dict] | Response:
        """The answers of `submitted` (SGLang's `/generate` dicts), or the error response to send."""
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
            return released_response()
        except asyncio.CancelledError:  # client went away: do not keep decoding for nobody
            for rid, _, _ in submitted:
                self.batcher.abort(rid)
            raise
        except Exception as exc:  # the engine failed this request (logged by the decode thread)
            return error_response(500, f"generation failed: {exc}")
        return results

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
            return released_response()
        try:
            one_token = SamplingParams(max_new_tokens=1, temperature=0)
            await self.batcher.generate([0], one_token, rid=f"health-{time.time_ns()}")
        except EngineReleasedError:
            return released_response()
        return Response(status_code=200)
