"""OpenAI-compatible `/v1/completions`, `/v1/chat/completions` and `/v1/models`, as SGLang serves
them, for clients written against an OpenAI endpoint (slime's rollout-buffer generator, agent
frameworks). Each request is translated into a `/generate` body and goes through the same parsing,
batcher and client-gone handling (`GenerateRoutes`); the chat prompt is the model's chat template
with the generation prompt. One choice per request (`n` > 1 is refused), no streaming; the answer
carries `usage` and, when asked (`logprobs`), the sampled tokens' log-probs.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from slime.engine.batcher import EngineReleasedError
from slime.engine.generate_routes import GenerateRoutes
from slime.engine.http_errors import error_response, released_response
from slime.engine.request_parsing import BadRequest, generation_body, parse_generate_body


class OpenAIRoutes:
    def __init__(self, generation: GenerateRoutes, model_name: str):
        self.generation, self.model_name = generation, model_name

    async def models(self) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "slime"}]}
        )

    async def completions(self, request: Request) -> Response:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._serve(request, chat=True)

    async def _serve(self, request: Request, chat: bool) -> Response:
        body = await generation_body(request)
        if isinstance(body, JSONResponse):
            return body
        gen = self.generation
        if not gen.batcher.serving:
            return released_response()
        try:
            generate_body = self._generate_body(body, chat)
            parsed = parse_generate_body(
                generate_body, gen.tokenizer, gen.batcher.vocab_size, gen.batcher.context_length
            )
            submitted = gen._submit_all(parsed)  # noqa: SLF001 - the same submission as /generate
        except BadRequest as exc:
            return error_response(400, str(exc))
        except EngineReleasedError:
            return released_response()
        except ValueError as exc:
            return error_response(400, str(exc))
        results = await gen.results(request, submitted)
        if isinstance(results, Response):
            return results
        return JSONResponse(self._answer(body, results[0], chat, want_logprobs=bool(body.get("logprobs"))))

    def _generate_body(self, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        if body.get("stream"):
            raise BadRequest("stream is not supported by this engine's OpenAI endpoints (use /generate)")
        if int(body.get("n") or 1) != 1:
            raise BadRequest("n: only one choice per request")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("messages: a non-empty list is required")
            tok = self.generation.tokenizer
            try:
                # continue_final_message (SGLang's, as slime's rollout buffer resumes a partial answer): the last
                # assistant message is continued instead of a new one being opened
                go_on = bool(body.get("continue_final_message"))
                text = tok.apply_chat_template(
                    messages,
                    tools=body.get("tools"),
                    tokenize=False,
                    add_generation_prompt=not go_on,
                    continue_final_message=go_on,
                    **(body.get("chat_template_kwargs") or {}),
                )
            except Exception as exc:  # noqa: BLE001 - the template's own message says what is wrong
                raise BadRequest(f"messages: the chat template cannot render them: {exc}") from exc
            prompt: dict[str, Any] = {"input_ids": list(tok(text, add_special_tokens=False)["input_ids"])}
        else:
            raw = body.get("prompt")
            if isinstance(raw, str):
                prompt = {"text": raw}
            elif isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
                prompt = {"input_ids": raw}
            else:
                raise BadRequest("prompt: a string or a list of token ids is required")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        params = {
            "max_new_tokens": 16 if max_tokens is None and not chat else max_tokens,
            "temperature": body.get("temperature", 1.0),
            "top_p": body.get("top_p", 1.0),
            "stop": body.get("stop"),
            "seed": body.get("seed"),
        }
        if "top_k" in body:
            params["top_k"] = body["top_k"]
        return {
            **prompt,
            "sampling_params": {k: v for k, v in params.items() if v is not None},
            "return_logprob": bool(body.get("logprobs")),
        }

    def _answer(self, body: dict[str, Any], out: dict[str, Any], chat: bool, want_logprobs: bool) -> dict[str, Any]:
        meta = out.get("meta_info", {})
        reason = meta.get("finish_reason")
        kind = reason.get("type") if isinstance(reason, dict) else reason
        finish = kind if kind in ("stop", "length") else "stop" if kind is None else kind
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        pairs = meta.get("output_token_logprobs") or []
        if chat:
            choice["message"] = {"role": "assistant", "content": out.get("text", "")}
            if want_logprobs:
                choice["logprobs"] = {
                    "content": [
                        {"token": self.generation.tokenizer.decode([tid]), "logprob": lp, "token_id": tid}
                        for lp, tid, *_ in pairs
                    ]
                }
        else:
            choice["text"] = out.get("text", "")
            if want_logprobs:
                choice["logprobs"] = {
                    "tokens": [self.generation.tokenizer.decode([tid]) for _, tid, *_ in pairs],
                    "token_logprobs": [lp for lp, *_ in pairs],
                }
        prompt_tokens, completion_tokens = int(meta.get("prompt_tokens", 0)), int(meta.get("completion_tokens", 0))
        return {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
