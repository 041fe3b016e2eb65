"""Weight-sync endpoints, SGLang's paths and bodies (answers `{"success", "message", ...}`, 400 on refusal):
`/update_weights_from_disk`, `/update_weights_from_tensor` (payloads of slime.weights.transfer),
`/init_weights_update_group` (gloo only; optional `timeout` seconds, default 120; optional
`weight_transport` "auto" | "broadcast": "auto" maps the trainer's shared-memory ring when on its host,
see slime.weights.ring), `/update_weights_from_distributed`, `/destroy_weights_update_group` and
`/weights_checker` (`action`: snapshot | compare [with optional `checksums` {name: sha256}] |
compare_checksum | checksum | reset/reset_tensors; a compare answers per-tensor equality, 200 when all
equal, 400 otherwise). A push is validated against the model before anything is written.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from slime.engine.batcher import HFBatcher
from slime.engine.http_errors import error_response, refusal, weights_released_refusal
from slime.engine.request_parsing import BadRequest, parse_weight_version, read_json_object, read_strict_json_object
from slime.weights.transfer import WeightFormatError, deserialize_named_tensors
from slime.weights.receive import (
    UpdateGroups,
    WeightChecker,
    WeightUpdateError,
    check_against_model,
    model_tensors,
    parse_metadata,
)

_DEFAULT_GROUP = "weight_update_group"


class WeightSync:
    """Handlers of the weight-sync endpoints around one HFBatcher, its update groups and its checker."""

    def __init__(self, batcher: HFBatcher, groups: UpdateGroups, checker: WeightChecker):
        self.batcher, self.groups, self.checker = batcher, groups, checker

    def _done(self, restarted: int) -> dict:
        return {
            "success": True,
            "message": "Succeeded to update model weights.",
            "weight_version": self.batcher.weight_version,
            "num_restarted_requests": restarted,
        }

    async def update_from_disk(self, request: Request) -> Response:
        body = await read_json_object(request)
        if not isinstance(body.get("model_path"), str):
            return error_response(400, "model_path (string) is required")
        version = body.get("weight_version")
        result = await self.batcher.update_weights_from_disk(
            body["model_path"], None if version is None else str(version)
        )
        return JSONResponse(result, status_code=200 if result["success"] else 400)

    async def update_from_tensor(self, request: Request) -> Response:
        b = self.batcher
        try:
            body = await read_strict_json_object(request)
            item = _one_serialized_bucket(body)
            version = parse_weight_version(body)
        except BadRequest as exc:
            return refusal(400, str(exc))
        if body.get("abort_all_requests"):
            b.abort_all()
        async with b.weights_lock:
            if not b.weights_loaded:
                return weights_released_refusal()
            try:
                named = await asyncio.to_thread(deserialize_named_tensors, item)
                check_against_model(
                    model_tensors(b.model),
                    [n for n, _ in named],
                    [t.dtype for _, t in named],
                    [list(t.shape) for _, t in named],
                )
            except (WeightFormatError, WeightUpdateError) as exc:
                return refusal(400, str(exc))
            restarted = await b.apply_weights(named, version)
        return JSONResponse(self._done(restarted))

    async def init_group(self, request: Request) -> Response:
        try:
            body = await read_strict_json_object(request)
            args = [body.get(k) for k in ("master_address", "master_port", "rank_offset", "world_size")]
            answer = await asyncio.to_thread(
                self.groups.init,
                *args,
                body.get("group_name", _DEFAULT_GROUP),
                body.get("backend", "gloo"),
                body.get("timeout"),
                body.get("weight_transport"),
            )
        except (BadRequest, WeightUpdateError) as exc:
            return refusal(400, str(exc))
        return JSONResponse({"success": True, **answer})

    async def destroy_group(self, request: Request) -> Response:
        try:
            body = await read_strict_json_object(request)
            msg = self.groups.destroy(body.get("group_name", _DEFAULT_GROUP))
        except (BadRequest, WeightUpdateError) as exc:
            return refusal(400, str(exc))
        return JSONResponse({"success": True, "message": msg})

    async def update_from_distributed(self, request: Request) -> Response:
        b = self.batcher
        try:
            body = await read_strict_json_object(request)
            names, dtypes, shapes = parse_metadata(body.get("names"), body.get("dtypes"), body.get("shapes"))
            version = parse_weight_version(body)
        except (BadRequest, WeightUpdateError) as exc:
            return refusal(400, str(exc))
        if body.get("abort_all_requests"):
            b.abort_all()
        group, load_format = body.get("group_name", _DEFAULT_GROUP), body.get("load_format")
        groups = self.groups
        async with b.weights_lock:
            refusal_answer = self._refuse_metadata(names, dtypes, shapes)
            try:
                # through the shared-memory ring any layout is copied straight into the parameters
                ring = await asyncio.to_thread(groups.uses_ring, group)
                if refusal_answer is None and (load_format is None or ring):
                    # straight into the parameters, in the decode thread: no copy, and nothing decodes meanwhile
                    restarted = await b.write_weights(
                        lambda table: groups.receive(group, names, dtypes, shapes, None, [table[n] for n in names]),
                        version,
                    )
                    return JSONResponse(self._done(restarted))
                # A refused bucket is still received (and dropped), so the broadcast completes on every rank.
                received = await asyncio.to_thread(groups.receive, group, names, dtypes, shapes, load_format)
            except WeightUpdateError as exc:
                return refusal(400, str(exc))
            except RuntimeError as exc:  # the broadcast failed or timed out
                return refusal(500, f"{exc}; the weights may be partly updated (version kept): push them again")
            if refusal_answer is not None:
                return refusal_answer
            restarted = await b.apply_weights(received, version)
        return JSONResponse(self._done(restarted))

    def _refuse_metadata(self, names: list, dtypes: list, shapes: list) -> Response | None:
        """The answer refusing a distributed bucket the served model cannot take, or None to take it."""
        if not self.batcher.weights_loaded:
            return weights_released_refusal()
        try:
            check_against_model(model_tensors(self.batcher.model), names, dtypes, shapes)
        except WeightUpdateError as exc:
            return refusal(400, str(exc))
        return None

    async def weights_checker(self, request: Request) -> Response:
        b, checker = self.batcher, self.checker
        try:
            body = dict(request.query_params) if request.method == "GET" else await read_strict_json_object(request)
        except BadRequest as exc:
            return refusal(400, str(exc))
        action = body.get("action")
        if action not in WeightChecker.ACTIONS:
            return refusal(400, f"action must be one of {', '.join(WeightChecker.ACTIONS)}, got {action!r}")
        if not b.weights_loaded:
            return weights_released_refusal()
        if action in ("reset", "reset_tensors"):
            return await self._reset(body.get("seed"))
        expected = body.get("checksums")
        if action == "compare_checksum" and expected is None:
            return refusal(400, "compare_checksum needs checksums: {tensor name: sha256 hex}")
        if expected is not None and not (
            isinstance(expected, dict)
            and expected
            and all(isinstance(k, str) and isinstance(v, str) for k, v in expected.items())
        ):
            return refusal(400, "checksums must be a non-empty object {tensor name: sha256 hex string}")
        if action.startswith("compare") and expected is None:
            if checker.snapshot is None:
                return refusal(
                    400, "no snapshot to compare with: call check_weights('snapshot') first, or send checksums"
                )
            expected = checker.snapshot
        actual = await b.weight_checksums()
        if action == "snapshot":
            checker.snapshot = actual
            return JSONResponse(
                {
                    "success": True,
                    "message": f"Snapshot of {len(actual)} tensors taken.",
                    "num_tensors": len(actual),
                    "weight_version": b.weight_version,
                }
            )
        if action == "checksum":
            return JSONResponse(
                {
                    "success": True,
                    "message": f"{len(actual)} tensors.",
                    "checksums": actual,
                    "weight_version": b.weight_version,
                }
            )
        result = WeightChecker.compare(actual, expected)
        result["weight_version"] = b.weight_version
        return JSONResponse(result, status_code=200 if result["equal"] else 400)

    async def _reset(self, seed: object) -> Response:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            return refusal(400, f"seed must be an integer, got {seed!r}")
        restarted = await self.batcher.reset_tensors(seed)
        return JSONResponse(
            {"success": True, "message": "Weights reset to random values.", "num_restarted_requests": restarted}
        )


def _one_serialized_bucket(body: dict) -> str:
    items = body.get("serialized_named_tensors")
    if not (isinstance(items, list) and len(items) == 1 and isinstance(items[0], str)):
        raise BadRequest(
            "serialized_named_tensors must be a list of one string (one per TP rank; this "
            "engine has tp_size 1) made by slime.weights.transfer.serialize_named_tensors"
        )
    if body.get("load_format") not in (None, "flattened_bucket"):
        raise BadRequest(f"load_format must be null or 'flattened_bucket', got {body.get('load_format')!r}")
    return items[0]
