"""Control endpoints: `/abort_request`, `/pause_generation` (`mode` in_place, the default here; retract,
the same here, since a request with tokens is recomputed if the weights change; or abort; SGLang's
default is abort), `/continue_generation`, `/flush_cache` and the memory occupation pair (tags `weights`
and `kv_cache`, so slime's colocated order works: resume the weights, push, then resume the KV cache)."""

from __future__ import annotations

from starlette.requests import Request

from slime.engine.batcher import HFBatcher
from slime.engine.http_errors import error_response, refusal
from slime.engine.request_parsing import read_json_object

PAUSE_MODES = (None, "in_place", "retract", "abort")


class ControlRoutes:
    def __init__(self, batcher: HFBatcher):
        self.batcher = batcher

    async def abort_request(self, request: Request):
        body = await read_json_object(request)
        if body.get("abort_all"):
            self.batcher.abort_all()
        elif body.get("rid"):
            self.batcher.abort(str(body["rid"]))
        else:
            return error_response(400, "abort_request needs rid or abort_all: true")
        return {"success": True}

    async def pause_generation(self, request: Request):
        mode = (await read_json_object(request)).get("mode")
        if mode not in PAUSE_MODES:
            return refusal(400, f"mode must be 'in_place', 'retract' or 'abort', got {mode!r}")
        if mode == "abort":  # drop in-flight requests (answered with finish_reason abort), then pause
            self.batcher.abort_all()
        await self.batcher.pause()
        return {"success": True, "message": "Generation paused."}

    async def continue_generation(self):
        self.batcher.resume_generation()
        return {"success": True, "message": "Generation continued."}

    async def flush_cache(self):
        return {"success": True, "message": "Cache flushed."}  # no prefix cache to flush

    async def release_memory_occupation(self, request: Request):
        await self.batcher.release((await read_json_object(request)).get("tags"))
        return {"success": True, "message": "Memory released."}

    async def resume_memory_occupation(self, request: Request):
        try:
            await self.batcher.resume((await read_json_object(request)).get("tags"))
        except Exception as exc:  # noqa: BLE001 - the reload failed: the caller gets the reason, we keep serving
            return error_response(500, f"failed to reload weights from {self.batcher.model_path}: {exc}")
        return {"success": True, "message": "Memory resumed."}
