"""slime's adapter API (`BaseAdapter`, `call_sglang_generate`, ...) over the gateway's pipeline.

An adapter is an aiohttp application (slime runs it in a thread with `run_app_in_thread`) whose
routes map to protocol modules; every turn goes through `TurnPipeline` with `FullRender` (slime
renders every prompt whole, with any tokenizer) and reaches the engines through
`call_sglang_generate`, looked up at call time so tests can replace it as slime's do. The
FastAPI `Gateway` is the same pipeline with append-only prompts.

As in slime, a request names its session by a key (Bearer / x-api-key / X-Session-Id, OpenAI's
body fallbacks) and the key is the sid unless `open_session(sid, key=...)` says otherwise; unlike
slime, only an opened session's key is accepted (401 otherwise): no request opens a session or
writes into one it was not given. The key is the credential: name sessions unguessably.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from aiohttp import web

from slime.agent.gateway.engine_call import EngineTurns, sampling_params
from slime.agent.gateway.errors import BadRequestError, error_answer
from slime.agent.gateway.pipeline import Turn, TurnPipeline
from slime.agent.gateway.protocols import openai_responses
from slime.agent.gateway.protocols.common import bearer, flatten_content, tool_call_dict
from slime.agent.gateway.protocols.openai_chat import body_session
from slime.agent.gateway.records import ChatRequest, TurnRecord
from slime.agent.gateway.rendering import FullRender, PromptRenderer
from slime.agent.gateway.session import Session, SessionTable
from slime.agent.gateway.trajectory import TrajectoryManager
from slime.rollout.engine_client import EngineClient
from slime.utils.endpoints import Endpoints
from slime.utils.types import Sample

__all__ = [
    "BaseAdapter",
    "TurnRecord",
    "call_sglang_generate",
    "flatten_content",
    "sid_from_bearer",
    "sid_from_body",
    "tool_call_dict",
]

logger = logging.getLogger(__name__)
MAX_BODY_BYTES = 64 * 1024 * 1024  # agent CLIs send their whole history and tool schemas every turn


def sid_from_bearer(request: Any) -> str | None:
    return bearer(request.headers)


def sid_from_body(body: dict | None) -> str | None:
    return body_session(body or {})


async def call_sglang_generate(
    prompt_ids: list[int], session: Session, body: dict, *, adapter: BaseAdapter, session_id: str | None = None
) -> TurnRecord:
    """One turn on the engines (slime's seam): `body` is the wire request the sampling keys come from."""
    request = adapter.parse(adapter.protocol_of(body), body, {}, session_id)
    params = sampling_params(session, request, len(prompt_ids))
    key = session_id if session_id and session_id != "default" else None
    return await adapter.engine.generate(prompt_ids, params, routing_key=key, top_logprobs_num=request.top_logprobs)


class BaseAdapter:
    """`routes`: POST path -> protocol module; `default_protocol` reads sampling keys for
    `call_sglang_generate`."""

    routes: dict[str, ModuleType] = {}
    default_protocol: ModuleType

    def __init__(
        self,
        *,
        tokenizer: Any,
        sglang_url: str,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
        max_turns_per_sid: int | None = None,
        fork_threshold_tokens: int | None = None,
        debug_callback: Callable[..., None] | None = None,
        client: EngineClient | None = None,
        renderer: PromptRenderer | None = None,
    ) -> None:
        """`renderer`: slime renders every prompt whole (`FullRender`, any tokenizer); pass
        `DeltaRender(tokenizer)` for append-only prompts with a Hugging Face tokenizer."""
        self.tokenizer = tokenizer
        url = sglang_url.rstrip("/")
        self._owns_client = client is None  # a client passed in is its giver's to close
        self.client = client or EngineClient(Endpoints(router_url=url, engine_urls=[url]), tokenizer=tokenizer)
        self.engine = EngineTurns(self.client)
        self.manager = TrajectoryManager(fork_threshold_tokens=fork_threshold_tokens)
        self.sessions = SessionTable(max_turns=max_turns_per_sid)
        self.debug_callback = debug_callback
        self.pipeline = TurnPipeline(
            tokenizer=tokenizer,
            renderer=renderer or FullRender(tokenizer),
            generate=self._generate,
            manager=self.manager,
            sessions=self.sessions,
            tool_parser=tool_parser,
            reasoning_parser=reasoning_parser,
        )
        self.app = web.Application(client_max_size=MAX_BODY_BYTES)
        self.app.router.add_get("/healthz", _health)
        self.app.router.add_get("/v1/models", _health)
        for path, protocol in self.routes.items():
            self.app.router.add_post(path, self._route(protocol))
        self.app.on_cleanup.append(self._close)

    def parse(self, protocol: ModuleType, body: dict, headers: Any, sid: str | None) -> ChatRequest:
        return protocol.parse_request(body, headers, sid)

    def protocol_of(self, body: dict) -> ModuleType:
        """Which of this adapter's protocols a body is (a Responses body has `input`, no `messages`)."""
        if "messages" not in body and "input" in body and openai_responses in self.routes.values():
            return openai_responses
        return self.default_protocol

    async def _generate(self, prompt_ids: list[int], session: Session, request: ChatRequest) -> TurnRecord:
        return await call_sglang_generate(prompt_ids, session, request.raw, adapter=self, session_id=request.session_id)

    def _route(self, protocol: ModuleType) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                body = await request.json()
            except (ValueError, RecursionError) as e:  # (RecursionError: nested too deeply to read)
                return web.json_response(
                    protocol.render_error(BadRequestError(f"the body is not JSON: {e}")), status=400
                )
            try:
                if not isinstance(body, dict):
                    raise BadRequestError("the request body must be a JSON object")
                req = self.parse(protocol, body, request.headers, None)
                req = dataclasses.replace(req, session_id=self.sessions.by_key(req.session_id).sid)
                turn = await self.pipeline.run(req)
            except Exception as e:  # noqa: BLE001 - never a bare 500: the client gets the reason in its format
                status, answer = error_answer(protocol, e, f"agent adapter: {request.path}")
                return web.json_response(answer, status=status)
            try:
                response = await self._respond(request, protocol, turn)
            except (ConnectionResetError, asyncio.CancelledError):
                self.pipeline.abandon(turn)  # the client never got it: not a turn of the trajectory
                raise
            if self.pipeline.commit(turn) and self.debug_callback is not None:
                self._debug(turn)
            return response

        return handle

    async def _respond(self, request: web.Request, protocol: ModuleType, turn: Turn) -> web.StreamResponse:
        if not turn.request.stream:
            return web.json_response(protocol.render_reply(turn.reply, turn.request))
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await out.prepare(request)
        for event in protocol.render_stream(turn.reply, turn.request):
            await out.write(event.encode())
        await out.write_eof()
        return out

    def _debug(self, turn: Turn) -> None:
        try:
            self.debug_callback(
                turn.request.session_id, turn.request.messages, turn.request.tools, turn.reply.message, turn.record
            )
        except Exception:  # noqa: BLE001 - a debugging hook must not fail the turn; the error is logged
            logger.exception("debug_callback failed (sid=%s)", turn.request.session_id)

    async def _close(self, app: web.Application) -> None:
        await (self.client.close() if self._owns_client else self.client.close_loop())

    # ---------------------------------------------------------------- sessions (slime's API)

    def open_session(
        self, sid: str, *, sampling_defaults: dict | None = None, max_context_tokens: int = 0, key: str | None = None
    ) -> str:
        """Open `sid`; its requests must carry `key` (default: the sid, slime's contract), returned."""
        self.sessions.open(sid, key=key, sampling_defaults=sampling_defaults, max_context_tokens=max_context_tokens)
        return self.sessions.key_of(sid)

    async def finish_session(
        self,
        sid: str,
        *,
        base_sample: Sample,
        reward: float = 0.0,
        extra_metadata: dict | None = None,
        wait_timeout: float = 5.0,
    ) -> list[Sample]:
        return await self.pipeline.finish(
            sid, base_sample=base_sample, reward=reward, extra_metadata=extra_metadata, wait_timeout=wait_timeout
        )

    async def shutdown_session(self, sid: str, *, wait_timeout: float = 5.0) -> None:
        session = self.sessions.close(sid)
        if session is not None:
            await session.drain(wait_timeout)

    async def drop_session(self, sid: str, *, wait_timeout: float = 5.0) -> None:
        await self.pipeline.drop(sid, wait_timeout=wait_timeout)


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})
