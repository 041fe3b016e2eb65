"""The embedded engine's ASGI app: SGLang's paths, each served by one handler object around the
same HFBatcher (generation, OpenAI-compatible generation, status, control, weight sync).

A Starlette app, not FastAPI (which SGLang's own server is): the handlers read their requests themselves,
so FastAPI added only its import (~0.5 CPU s of every engine start, pydantic's schemas included) and its
per-request dependency solving. What a client sees is FastAPI's: plain data answered as JSON, and errors
Starlette raises (404, 405) with FastAPI's `{"detail": ...}` body."""

from __future__ import annotations

import inspect
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from slime.engine.batcher import HFBatcher
from slime.engine.control_routes import ControlRoutes
from slime.engine.generate_routes import GenerateRoutes
from slime.engine.openai_routes import OpenAIRoutes
from slime.engine.status_routes import StatusRoutes
from slime.engine.weight_routes import WeightSync
from slime.weights.receive import UpdateGroups, WeightChecker

GET, POST = ("GET",), ("POST",)


class Server:
    """The handler objects of one app (kept as a class so tests can build apps in-process). The server's
    lifecycle closes `groups` and shuts the batcher down."""

    def __init__(self, batcher: HFBatcher, tokenizer: Any = None):
        from slime.utils.processing_utils import load_tokenizer

        self.batcher = batcher
        # Own tokenizer instance: the batcher's one is used concurrently by the decode thread.
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(batcher.tokenizer_path)
        self.groups = UpdateGroups()
        self.checker = WeightChecker()
        self.generation = GenerateRoutes(batcher, self.tokenizer)
        self.openai = OpenAIRoutes(self.generation, batcher.tokenizer_path)
        self.status = StatusRoutes(batcher)
        self.control = ControlRoutes(batcher)
        self.weights = WeightSync(batcher, self.groups, self.checker)

    def routes(self) -> list[tuple[str, tuple[str, ...], Callable]]:
        gen, status, control, weights = self.generation, self.status, self.control, self.weights
        return [
            ("/generate", ("POST", "PUT"), gen.generate),
            ("/v1/completions", POST, self.openai.completions),
            ("/v1/chat/completions", POST, self.openai.chat_completions),
            ("/v1/models", GET, self.openai.models),
            ("/health", GET, status.health),
            ("/health_generate", GET, gen.health_generate),
            ("/server_info", GET, status.server_info),
            ("/get_server_info", GET, status.server_info),
            ("/model_info", GET, status.model_info),
            ("/get_model_info", GET, status.model_info),
            ("/get_load", GET, status.get_load),
            ("/get_weight_version", GET, status.get_weight_version),
            ("/metrics", GET, status.metrics),
            ("/abort_request", POST, control.abort_request),
            ("/pause_generation", POST, control.pause_generation),
            ("/continue_generation", POST, control.continue_generation),
            ("/flush_cache", ("GET", "POST"), control.flush_cache),
            ("/release_memory_occupation", POST, control.release_memory_occupation),
            ("/resume_memory_occupation", POST, control.resume_memory_occupation),
            ("/update_weights_from_disk", POST, weights.update_from_disk),
            ("/update_weights_from_tensor", POST, weights.update_from_tensor),
            ("/init_weights_update_group", POST, weights.init_group),
            ("/update_weights_from_distributed", POST, weights.update_from_distributed),
            ("/destroy_weights_update_group", POST, weights.destroy_group),
            ("/weights_checker", ("GET", "POST"), weights.weights_checker),
        ]


def create_app(batcher: HFBatcher, tokenizer: Any = None) -> Starlette:
    """`tokenizer`: the handlers' own instance if one is already loaded (else loaded here)."""
    srv = Server(batcher, tokenizer)
    routes = [Route(path, endpoint(handler), methods=list(methods)) for path, methods, handler in srv.routes()]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    app.state.server = srv
    return app


def endpoint(handler: Callable) -> Callable:
    """`handler` as a Starlette endpoint: called with the request if it takes one, its plain data (a dict,
    a list) answered as JSON; every handler here is a coroutine."""
    if not inspect.iscoroutinefunction(handler):
        raise TypeError(f"{handler.__qualname__}: engine handlers are coroutines")
    takes_request = bool(inspect.signature(handler).parameters)

    async def serve(request: Request) -> Response:
        out = await (handler(request) if takes_request else handler())
        return out if isinstance(out, Response) else JSONResponse(out)

    serve.__name__ = serve.__qualname__ = handler.__name__
    return serve


async def http_error(request: Request, exc: HTTPException) -> Response:
    """FastAPI's body for the errors routing raises (404 unknown path, 405 method): `{"detail": ...}`."""
    if exc.status_code in (204, 304):
        return Response(status_code=exc.status_code, headers=exc.headers)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
