"""`Gateway`: the HTTP server agents talk to -- OpenAI Chat Completions, OpenAI Responses and
Anthropic Messages in front of the engine pool, streaming or not.

Every request must hold its session's key, an unguessable secret `open_session` mints and the host
gives only to that session's agent: in the base URL (`/s/<key>/v1/...`), the `X-Session-Id` header,
or as the API key (Bearer / x-api-key); the first of these the request carries decides. A request
without an open session's key is refused (401 in its API's error format) before anything is
recorded, and no session is ever opened by a request. Turns run through `TurnPipeline` with
`DeltaRender` (append-only prompts) and `EngineClient`; a refusal is answered in the client's
own API error format. The server (FastAPI on uvicorn, 127.0.0.1 by default; the turn routes are
served ahead of FastAPI's middleware and routing, `AgentRoutes`) runs on a thread of its own, so
rollout code on any loop can open and finish sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import threading
from collections.abc import AsyncIterator, Iterable
from types import ModuleType
from typing import Any
from urllib.parse import quote

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from slime.agent.gateway.engine_call import EngineTurns, sampling_params
from slime.agent.gateway.errors import BadRequestError, SessionClosedError, TurnRefused, UnknownRouteError, error_answer
from slime.agent.gateway.images import ConversationImages
from slime.agent.gateway.pipeline import Turn, TurnPipeline
from slime.agent.gateway.protocols import anthropic, openai_chat, openai_responses
from slime.agent.gateway.protocols.common import bearer, header_session
from slime.agent.gateway.records import ChatRequest, TurnRecord
from slime.agent.gateway.rendering import DeltaRender, PromptRenderer
from slime.agent.gateway.session import Session, SessionTable
from slime.agent.gateway.trajectory import TrajectoryManager
from slime.rollout.engine_client import EngineClient
from slime.utils.client_gone import client_gone_future
from slime.utils.gc_freeze import freeze_startup_heap
from slime.utils.json_text import acyclic_dumps
from slime.utils.one_send_responses import OneSendResponses
from slime.utils.prompt_images import PromptImages
from slime.utils.types import Sample

logger = logging.getLogger(__name__)
START_TIMEOUT = 30.0  # seconds `Gateway.start` waits for the socket to listen
KEY_BYTES = 32  # a session key's entropy (secrets.token_urlsafe: 43 URL-safe characters)
REPLY_JSON = acyclic_dumps()  # (replies are dicts this code builds: no cycle to check for)
ROUTES: dict[str, ModuleType] = {
    "/v1/chat/completions": openai_chat,
    "/v1/responses": openai_responses,
    "/v1/messages": anthropic,
}


@dataclasses.dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port
    tool_parser: str | None = "hermes"
    reasoning_parser: str | None = None
    max_turns: int | None = None  # per session
    fork_threshold_tokens: int | None = None  # TrajectoryManager's default when None
    max_context_tokens: int = 0  # per session, prompt + answer; 0: the engines' own limit

    @classmethod
    def of(cls, config: Any) -> GatewayConfig:
        """The gateway's part of the agent rollout's config (`slime.agent.flags.AgentRolloutConfig`: the
        agent flags, --tool-call-parser, --rollout-max-context-len)."""
        return cls(
            port=config.agent.agent_gateway_port,
            tool_parser=config.tool_call_parser,
            max_turns=config.agent.agent_max_turns,
            fork_threshold_tokens=config.agent.agent_fork_threshold,
            max_context_tokens=int(config.rollout_max_context_len or 0),
        )


class Gateway:
    def __init__(
        self,
        client: EngineClient,
        *,
        tokenizer: Any = None,
        config: GatewayConfig | None = None,
        renderer: PromptRenderer | None = None,
        images: PromptImages | None = None,
    ) -> None:
        """`images`: a vision-language model's image side (`PromptImages.of_checkpoint`): image blocks are
        rendered with its placeholder tokens and sent as `image_data`; None refuses them by path."""
        self.config = config or GatewayConfig()
        self.client = client
        self.tokenizer = tokenizer if tokenizer is not None else client.tokenizer
        self.engine = EngineTurns(client)
        self.manager = TrajectoryManager(fork_threshold_tokens=self.config.fork_threshold_tokens, absorb_sampled=False)
        self.sessions = SessionTable(max_turns=self.config.max_turns, max_context_tokens=self.config.max_context_tokens)
        self.pipeline = TurnPipeline(
            tokenizer=self.tokenizer,
            renderer=renderer or DeltaRender(self.tokenizer),
            generate=self._generate,
            manager=self.manager,
            sessions=self.sessions,
            tool_parser=self.config.tool_parser,
            reasoning_parser=self.config.reasoning_parser,
            images=ConversationImages(images) if images is not None else None,
        )
        self.app = self._build_app()
        self.asgi = AgentRoutes(self.app)  # what the server serves: the turn routes first, then FastAPI
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    async def _generate(self, prompt_ids: list[int], session: Session, request: ChatRequest) -> TurnRecord:
        params = sampling_params(session, request, len(prompt_ids))
        return await self.engine.generate(
            prompt_ids,
            params,
            routing_key=request.session_id,
            top_logprobs_num=request.top_logprobs,
            images=tuple(self.pipeline.images_of(session, request)),
        )

    # ---------------------------------------------------------------- HTTP

    def _build_app(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[None]:
            yield
            await self.client.close_loop()  # the session of this server's loop (the client is the runtime's)

        app = FastAPI(lifespan=lifespan)
        for path, protocol in ROUTES.items():
            for prefix in ("", "/s/{key}"):  # plain routes: the endpoint reads its Request, FastAPI's
                app.add_route(prefix + path, self._endpoint(protocol, path), methods=["POST"])  # dependencies unused
        for prefix in ("", "/s/{key}"):
            app.add_api_route(prefix + "/v1/messages/count_tokens", self._count_tokens, methods=["POST"])
            app.add_api_route(prefix + "/v1/models", self._models, methods=["GET"])
        app.add_api_route("/health", self._health, methods=["GET"])
        app.add_exception_handler(404, _not_found)
        return app

    def _endpoint(self, protocol: ModuleType, path: str):
        async def endpoint(request: Request):
            try:
                req = await self._parse(protocol, request)
                answered = await self._answer_unless_gone(req, request)
                if answered is None:  # nobody is left to read an answer
                    return Response(status_code=499)
            except Exception as e:  # noqa: BLE001 - never a bare 500: the client gets the reason in its format
                status, answer = error_answer(protocol, e, f"agent gateway: {path}")  # (the route, no key in it)
                return JSONResponse(answer, status_code=status)
            turn, gone = answered
            if req.stream:
                gone.cancel()  # (the stream notices a departure itself)
                return StreamingResponse(
                    self._send(turn, protocol.render_stream(turn.reply, req)),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache"},
                )
            body = REPLY_JSON(protocol.render_reply(turn.reply, req)).encode()
            return TurnResponse(body, turn, gone, self.pipeline)

        endpoint.route_path = path
        return endpoint

    async def _parse(self, protocol: ModuleType, request: Request) -> ChatRequest:
        """The request of the session its key opens, its body parsed once and checked and translated
        only past the history an earlier body of the session already held (`BodyPrefixes`)."""
        session = self.sessions.by_key(request_key(request))
        parsed = session.bodies.parse(await read_body(request), protocol.HISTORY, protocol.__name__)
        if not isinstance(parsed.body, dict):
            raise BadRequestError("the request body must be a JSON object")
        req = protocol.parse_request(
            parsed.body,
            request.headers,
            session.sid,
            parsed.known,
            vision=self.pipeline.images is not None,
            strings_checked=parsed.strings_checked,
        )
        if req.known is not None:
            session.bodies.keep(parsed, req.known)
        return req

    async def _answer_unless_gone(self, req: ChatRequest, request: Request) -> tuple[Turn, asyncio.Future] | None:
        """The answered turn and the watch on its client (still watching: the answer's sender
        commits the turn only if the client is still there once the answer is out), or None when the
        client disconnects first: the turn is cancelled, so its engine request is aborted on the
        engine that has it (`EngineTurns`), and nothing is recorded or counted. A turn cancelled
        because its session was finished is refused in the API's format.

        The turn runs in the request's own task; the watch (`client_gone_future`: a future, no task of
        its own) cancels this one if the client leaves while the turn runs (as `router_loss.watch` does)."""
        task = asyncio.current_task()
        running = [True]

        def left() -> None:
            if running[0]:  # (runs on this loop, the task suspended in the turn)
                task.cancel()

        gone = client_gone_future(request, left)
        try:
            turn = await self.pipeline.run(req)
        except asyncio.CancelledError:
            running[0] = False
            if gone.done() and not gone.cancelled() and task.uncancel() == 0:  # cancelled by `left` only
                return None
            gone.cancel()
            if req.session_id in self.sessions:  # not its session's finish: the server's own cancellation
                raise
            task.uncancel()
            raise SessionClosedError(
                f"session {req.session_id!r} was finished while this turn was in flight; its sample is already built"
            ) from None
        except BaseException:
            gone.cancel()
            raise
        finally:
            running[0] = False
        return turn, gone

    async def _send(self, turn: Turn, chunks: Iterable[str]) -> AsyncIterator[bytes]:
        """The answer, then the commit: the response ends (its last chunk) only after the turn is
        recorded, and a client gone before the end leaves the turn unrecorded."""
        sent = False
        try:
            for chunk in chunks:
                yield chunk.encode()
            sent = True
        finally:
            if sent:
                self.pipeline.commit(turn)
            else:
                self.pipeline.withdraw(turn)

    async def _count_tokens(self, request: Request):
        """The ids the same body would send as the session's next turn: rendered against the session's
        prefix (the ids its answers really were), not re-rendered whole, which counts differently once
        an answer is not the template's canonical text. Opens nothing."""
        try:
            req = await self._parse(anthropic, request)  # the caller's own session only
            ids = self.pipeline.prompt_ids(self.sessions.get(req.session_id), req)
        except TurnRefused as e:
            return JSONResponse(anthropic.render_error(e), status_code=e.status)
        return {"input_tokens": len(ids)}

    async def _models(self, request: Request):
        return {"object": "list", "data": [{"id": "slime-actor", "object": "model", "owned_by": "slime"}]}

    async def _health(self):
        return {"ok": True, "sessions": len(self.sessions)}

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> Gateway:
        """Serve on a daemon thread; returns once the socket listens. The process's heap as it is by
        then is left out of garbage collection, once per process (`freeze_startup_heap`, as a rollout
        runtime's first binding does): the sessions' objects trigger full collections, and each would
        walk every module, tokenizer and config object the process holds (0.27 s per collection of a
        bench process's 455k objects: ~0.15 ms of a request's CPU, at concurrency 8)."""
        freeze_startup_heap()
        config = uvicorn.Config(
            self.asgi,
            host=self.config.host,
            port=self.config.port,
            log_level="warning",
            access_log=False,
            lifespan="on",
            proxy_headers=False,
            server_header=False,
            http=OneSendResponses,  # each answer's head and body in one send, not two
        )  # (nothing reads the client's address: uvicorn's X-Forwarded-* middleware would be one more
        # layer per request; no `server: uvicorn` header tells a client what serves it, and each header
        # is two regex checks per response)
        self._server = server = uvicorn.Server(config)
        started = threading.Event()
        startup = server.startup

        async def startup_then_signal(*a: Any, **kw: Any) -> None:
            await startup(*a, **kw)
            started.set()

        server.startup = startup_then_signal
        self._thread = threading.Thread(target=server.run, name="slime-agent-gateway", daemon=True)
        self._thread.start()
        if not started.wait(START_TIMEOUT) or not server.started:
            raise RuntimeError(
                f"agent gateway did not listen on {self.config.host}:{self.config.port} within {START_TIMEOUT}s"
            )
        self.port = server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def base_url(self, sid: str, api: str = "openai") -> str:
        """The base URL of the open session `sid`, its key in the path: OpenAI SDKs append
        /chat/completions (or /responses) to it, Anthropic's append /v1/messages."""
        return f"{self.url}{self.session_path(sid)}/v1" if api == "openai" else f"{self.url}{self.session_path(sid)}"

    def session_path(self, sid: str) -> str:
        """The path prefix holding the key of the open session `sid`, for a client that reaches the
        gateway at another address (a sandbox's egress). The key is percent-encoded."""
        return f"/s/{quote(self.sessions.key_of(sid), safe='')}"

    def session_key(self, sid: str) -> str:
        """The key of the open session `sid`: its agent's API key."""
        return self.sessions.key_of(sid)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=START_TIMEOUT)
            self._server = None

    # ---------------------------------------------------------------- sessions

    def open_session(
        self,
        sid: str,
        *,
        sampling_defaults: dict | None = None,
        max_context_tokens: int | None = None,
        max_turns: int | None = None,
    ) -> str:
        """Open `sid` and return its key, a fresh secret: give it to the session's agent only (as
        its API key, or in `base_url(sid)`); every request of the session must hold it."""
        key = secrets.token_urlsafe(KEY_BYTES)
        self.sessions.open(
            sid,
            key=key,
            sampling_defaults=sampling_defaults,
            max_context_tokens=max_context_tokens,
            max_turns=max_turns,
        )
        return key

    async def finish_session(
        self,
        sid: str,
        *,
        base_sample: Sample,
        reward: float = 0.0,
        extra_metadata: dict | None = None,
        wait_timeout: float = 5.0,
    ) -> list[Sample]:
        """The session's Samples, one per root-to-leaf chain (`reward` on each); closes it."""
        return await self.pipeline.finish(
            sid, base_sample=base_sample, reward=reward, extra_metadata=extra_metadata, wait_timeout=wait_timeout
        )

    async def drop_session(self, sid: str, *, wait_timeout: float = 5.0) -> None:
        await self.pipeline.drop(sid, wait_timeout=wait_timeout)


class TurnResponse:
    """A non-streamed answer (an ASGI response), then the commit: the turn is recorded only once the
    whole body is out and its client was still there (`gone` not done); else it is withdrawn."""

    def __init__(self, body: bytes, turn: Turn, gone: asyncio.Future, pipeline: TurnPipeline) -> None:
        self.body, self.turn, self.gone, self.pipeline = body, turn, gone, pipeline

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        delivered = False
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(self.body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": self.body})
            delivered = not self.gone.done()  # (checked before any await lets the watch see the end)
        finally:
            self.gone.cancel()
            if delivered:
                self.pipeline.commit(self.turn)
            else:
                self.pipeline.withdraw(self.turn)


class AgentRoutes:
    """The ASGI app the gateway serves: a POST to a turn route (`ROUTES`, plain or under `/s/<key>`)
    goes straight to its endpoint, everything else to the FastAPI app. A turn is the one request an
    agent makes thousands of times; its endpoint answers every outcome itself, in its API's format,
    so FastAPI's middleware layers and route matching (about a fifth of a request's CPU) add nothing
    to it. The key is a path segment, as the FastAPI route `/s/{key}` matches it."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.endpoints = {
            route.path: route.endpoint
            for route in app.routes
            if getattr(getattr(route, "endpoint", None), "route_path", None) in ROUTES
        }

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint, key = self.route(scope["path"])
            if endpoint is not None:
                scope["app"] = self.app
                scope["path_params"] = {"key": key} if key is not None else {}
                response = await endpoint(Request(scope, receive))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def route(self, path: str) -> tuple[Any, str | None]:
        """The endpoint serving `path` and the key in it (None: a plain route; no endpoint: not a turn)."""
        endpoint = self.endpoints.get(path)
        if endpoint is not None or not path.startswith("/s/"):
            return endpoint, None
        cut = path.find("/", 3)
        if cut <= 3:
            return None, None
        endpoint = self.endpoints.get("/s/{key}" + path[cut:])
        return (endpoint, path[3:cut]) if endpoint is not None else (None, None)


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    """A path no route serves (a malformed `/s/<key>` too), in the error format of the API it aims at."""
    protocol = anthropic if "/messages" in request.url.path else openai_chat
    return JSONResponse(
        protocol.render_error(
            UnknownRouteError(f"no route serves {request.method} at this path; base URLs come from `Gateway.base_url`")
        ),
        status_code=404,
    )


async def read_body(request: Request) -> bytes:
    """The request's body, read from its ASGI `receive` (starlette's `Request.body` wraps the same
    messages in a stream and its context managers); a client gone first is `ClientDisconnect`, as there."""
    chunks = []
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def request_key(request: Request) -> str | None:
    """The session key a request carries: in its URL, else `X-Session-Id`, else its API key."""
    return (
        request.path_params.get("key")
        or header_session(request.headers)
        or bearer(request.headers)
        or (request.headers.get("x-api-key") or "").strip()
        or None
    )
