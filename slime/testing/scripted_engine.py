"""An engine that speaks SGLang's HTTP protocol but answers from a script, not a model.

For tests and benchmarks only: it lets a test choose the exact token ids an "engine" samples
(multi-turn accounting, truncation, faults) and gives the benchmark a zero-latency engine, while
the real sglang-router sits in front of it exactly as it does in front of a real engine.

Like SGLang it refuses a `rid` that is already in flight (`400`) and honours `/abort_request`
by rid or `abort_all` (the aborted request answers at once with finish reason `abort`); a request
whose client closed the connection is aborted the same way (recorded in `disconnects`). A
`freeze(seconds)` knob makes every endpoint, health included, hang for that long: a stuck engine.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from typing import Any, Callable

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from slime.utils.client_gone import client_gone
from slime.utils.http1_server import Http1Only
from slime.testing.threaded_server import ThreadedServer

# script(request_body) -> {"output_ids": [...], "finish_type": "stop"|"length"|"abort",
#                          optional "log_probs": [...], "text": str, "matched": ...,
#                          "top_log_probs": [[[logprob, id], ...] per id] (sent when asked: top_logprobs_num)}
# or a misbehaving engine's answer (see `misbehave`): {"answer": <any JSON, NaN allowed>},
# {"raw": str, "media_type": str, "status": int} (exact bytes), or {"cut": str} (these bytes, then the
# connection is dropped mid-answer).
# A script that takes a second parameter, `script(body, aborted: asyncio.Event)`, is abort-aware:
# it is never cancelled, and answers an abort itself with the tokens it sampled so far and
# finish_type "abort", as SGLang does (partial rollout continues from those tokens).
Script = Callable[..., Any]


def default_log_prob(position: int) -> float:
    """Deterministic, distinct per position, so tests can check alignment."""
    return -0.01 * (position + 1)


class StreamCut(ConnectionError):
    """Raised inside a response body: the server drops the connection mid-answer."""


def misbehave(out: dict[str, Any]) -> Response | None:
    """The answer of a broken engine, when the script asks for one: a JSON value served verbatim
    (`json.dumps` writes NaN/Infinity as bare tokens, as a broken server would), exact bytes with
    any media type and status, or a body cut after its first bytes."""
    if "answer" in out:
        return Response(json.dumps(out["answer"]), media_type="application/json")
    if "raw" in out:
        return Response(out["raw"], status_code=out.get("status", 200), media_type=out.get("media_type", "text/html"))
    if "cut" in out:
        head = out["cut"].encode()

        async def body():
            yield head
            raise StreamCut("scripted engine: answer cut mid-way")

        return StreamingResponse(body(), media_type="application/json")
    return None


def build_app(
    script: Script, model_path: str, decode: Callable[[list[int]], str] | None = None, weight_version: str = "default"
) -> FastAPI:
    app = FastAPI()
    app.state.requests = []  # every /generate body received, for assertions
    app.state.aborts = []  # every /abort_request body received
    app.state.disconnects = []  # rids whose client closed the connection before the answer
    app.state.in_flight = {}  # rid -> asyncio.Event set by an abort
    app.state.frozen_until = 0.0  # time.monotonic() before which every endpoint hangs
    app.state.weight_version = weight_version  # set by /update_weights_from_disk; a script may override per answer

    async def thawed() -> None:
        """Hang while frozen (sleeping exactly until the thaw; a freeze may be extended meanwhile)."""
        while (left := app.state.frozen_until - time.monotonic()) > 0:
            await asyncio.sleep(left)

    def info() -> dict[str, Any]:
        return {
            "model_path": model_path,
            "tokenizer_path": model_path,
            "is_generation": True,
            "weight_version": app.state.weight_version,
        }

    @app.get("/health")
    @app.get("/health_generate")
    async def health():
        await thawed()
        return JSONResponse({})

    @app.get("/server_info")
    @app.get("/get_server_info")
    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info():
        return info()

    @app.get("/get_weight_version")
    async def get_weight_version():
        return {"weight_version": app.state.weight_version}

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        """No weights to load: only the version changes (SGLang's `weight_version` field)."""
        body = await request.json()
        if body.get("weight_version") is not None:
            app.state.weight_version = str(body["weight_version"])
        return {"success": True, "message": "scripted engine: weight version set"}

    @app.get("/get_load")
    async def load():
        return {"num_reqs": 0}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush():
        return JSONResponse({})

    @app.post("/abort_request")
    async def abort(request: Request):
        await thawed()
        body = await request.json()
        app.state.aborts.append(body)
        for rid, event in list(app.state.in_flight.items()):
            if body.get("abort_all") or body.get("rid") == rid:
                event.set()
        return JSONResponse({})

    abort_aware = sum(p.default is inspect.Parameter.empty for p in inspect.signature(script).parameters.values()) >= 2

    async def run_script(body: dict[str, Any], aborted: asyncio.Event) -> dict[str, Any] | None:
        """The script's answer, or None when the request was aborted first (an abort-aware script
        answers the abort itself)."""
        if abort_aware:
            out = script(body, aborted)
            return await out if asyncio.iscoroutine(out) else out
        out = script(body)
        if not asyncio.iscoroutine(out):
            return out
        work = asyncio.ensure_future(out)
        stop = asyncio.ensure_future(aborted.wait())
        await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not work.done():
            work.cancel()
            return None
        return work.result()

    @app.post("/generate")
    async def generate(request: Request):
        body = await request.json()
        await thawed()
        app.state.requests.append(body)
        rid = body.get("rid")
        if rid is not None and rid in app.state.in_flight:
            return JSONResponse({"error": {"message": f"rid {rid} is already in flight"}}, status_code=400)
        key = rid if rid is not None else object()  # requests without a rid only abort with abort_all
        aborted = app.state.in_flight[key] = asyncio.Event()

        async def abort_when_client_goes() -> None:
            await client_gone(request)
            app.state.disconnects.append(rid)
            aborted.set()

        watch = asyncio.ensure_future(abort_when_client_goes())
        try:
            out = await run_script(body, aborted)
        finally:
            watch.cancel()
            app.state.in_flight.pop(key, None)
        if out is None:
            out = {"output_ids": [], "finish_type": "abort", "text": ""}
        broken = misbehave(out)
        if broken is not None:
            return broken
        ids = list(out["output_ids"])
        lps = out.get("log_probs") or [default_log_prob(i) for i in range(len(ids))]
        meta = {
            "id": body.get("rid"),
            "finish_reason": {"type": out.get("finish_type", "stop"), "matched": out.get("matched")},
            "prompt_tokens": len(body.get("input_ids") or []),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": out.get("weight_version", app.state.weight_version),
            "e2e_latency": 0.0,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(lps, ids)]
            if body.get("top_logprobs_num") and "top_log_probs" in out:
                meta["output_top_logprobs"] = [[[lp, t, None] for lp, t in row] for row in out["top_log_probs"]]
        text = out.get("text")
        if text is None:
            text = decode(ids) if decode else ""
        return {"text": text, "output_ids": ids, "meta_info": meta}

    return app


class ScriptedEngine:
    """Serve `build_app(...)` from a background thread of this process."""

    def __init__(
        self,
        script: Script,
        model_path: str,
        port: int = 0,
        host: str = "127.0.0.1",
        decode: Callable[[list[int]], str] | None = None,
    ):
        """`port` 0: one the OS picks, bound at once (`ThreadedServer`); `url` names it."""
        self.app = build_app(script, model_path, decode)
        self._server = ThreadedServer(self.app, host, port, what="scripted engine")
        self.url = self._server.url

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.app.state.requests

    @property
    def aborts(self) -> list[dict[str, Any]]:
        return self.app.state.aborts

    @property
    def disconnects(self) -> list[str | None]:
        return self.app.state.disconnects

    def freeze(self, seconds: float) -> None:
        """Every endpoint (health included) hangs for `seconds` from now, as a stuck engine does."""
        self.app.state.frozen_until = time.monotonic() + seconds

    def start(self, timeout: float = 20.0) -> "ScriptedEngine":
        self._server.start(timeout)
        return self

    def stop(self) -> None:
        self._server.stop()


def main(argv: list[str] | None = None) -> None:
    """`python -m slime.testing.scripted_engine --port N --model-path DIR --tokens K`: a
    zero-latency engine answering every request with K fixed tokens (benchmarks)."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model-path", required=True)
    p.add_argument("--tokens", type=int, default=8)
    a = p.parse_args(argv)
    ids = list(range(100, 100 + a.tokens))

    def script(body: dict[str, Any]) -> dict[str, Any]:
        n = min(len(ids), int(body.get("sampling_params", {}).get("max_new_tokens", len(ids))))
        return {"output_ids": ids[:n], "finish_type": "length" if n < len(ids) else "stop", "text": ""}

    uvicorn.run(
        build_app(script, a.model_path), host=a.host, port=a.port, log_level="warning", access_log=False, http=Http1Only
    )


if __name__ == "__main__":
    main()
