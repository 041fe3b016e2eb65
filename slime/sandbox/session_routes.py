"""The session API over HTTP (`sessions.py` does the work):

    POST   /sessions                  {memory_mb, disk_mb, max_inodes, idle_timeout, max_lifetime,
                                       egress, env, files: {path: base64}, tar: base64}  -> the session
    GET    /sessions                  open sessions (without their ids) and counters
    GET    /sessions/{id}             one session
    POST   /sessions/{id}/exec        {command, env, cwd, timeout, stdin}
                                      -> {status, returncode, stdout, stderr, execution_time, cpu_time, message}
    PUT    /sessions/{id}/files       {path, content: base64}
    GET    /sessions/{id}/files?path= -> {path, content: base64}
    DELETE /sessions/{id}

Bodies are bounded as ``/run_code``'s (``--max-body-mb``: 413; ``--body-timeout``: 408); a wrong field
answers 422 naming it; a busy server 429 with ``Retry-After``; an unknown session 404.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
from typing import Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from typing_extensions import Annotated

from slime.sandbox.run_plan import b64decode_pieces
from slime.sandbox.schema import KeyBudget, check_files
from slime.sandbox.sessions import SessionError, SessionSettings, SessionSpec, SessionTable, inside_path


def no_nul(value: str | None) -> str | None:
    """A string that reaches exec (a command, a directory, a path): a NUL byte would cut it short."""
    if value is not None and "\x00" in value:
        raise ValueError("must not contain a NUL byte")
    return value


def env_vars(env: dict[str, str]) -> dict[str, str]:
    """Environment variables exec can set: a name without '=' or NUL, a value without NUL."""
    for name, value in env.items():
        if not name or "=" in name or "\x00" in name:
            raise ValueError(f"{name!r} is not a variable name (empty, or with '=' or NUL)")
        if "\x00" in value:
            raise ValueError(f"the value of {name!r} contains a NUL byte")
    return env


ExecText = Annotated[str, AfterValidator(no_nul)]


def _models(cfg, settings: SessionSettings):
    def env_size(env: dict[str, str]) -> dict[str, str]:
        size = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in env.items())
        if size > cfg.max_env_bytes:
            raise ValueError(
                f"{size} bytes of variables (names and values) exceed the {cfg.max_env_bytes} a "
                "program's environment may have"
            )
        return env

    Env = Annotated[
        dict[str, str], Field(max_length=cfg.max_env_vars), AfterValidator(env_vars), AfterValidator(env_size)
    ]

    class OpenSession(BaseModel):
        model_config = ConfigDict(extra="forbid")

        memory_mb: int = Field(cfg.default_memory_mb, ge=cfg.min_memory_mb, le=cfg.max_memory_mb)
        disk_mb: int = Field(cfg.disk_mb, ge=1, le=settings.max_disk_mb)
        max_inodes: int = Field(cfg.max_inodes, ge=1024, le=1 << 22)
        idle_timeout: float = Field(settings.idle_timeout, gt=0, le=settings.max_lifetime)
        max_lifetime: float = Field(settings.max_lifetime, gt=0, le=settings.max_lifetime)
        egress: str | None = None
        env: Env = Field(default_factory=dict)
        files: dict[str, str] = Field(default_factory=dict, max_length=cfg.max_files)
        tar: str | None = None

    class Exec(BaseModel):
        model_config = ConfigDict(extra="forbid")

        command: ExecText = Field(min_length=1)
        env: Env = Field(default_factory=dict)
        cwd: ExecText | None = None
        timeout: float = Field(120.0, gt=0, le=settings.max_exec_timeout)
        stdin: str | None = None

    class WriteFile(BaseModel):
        model_config = ConfigDict(extra="forbid")

        path: ExecText = Field(min_length=1)
        content: str = ""

    return OpenSession, Exec, WriteFile


def add_session_routes(app, table: SessionTable, *, max_body: int, body_timeout: float) -> None:
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    cfg = table.runner.cfg
    OpenSession, Exec, WriteFile = _models(cfg, table.settings)

    def error(e: SessionError) -> JSONResponse:
        body: dict[str, Any] = {"status": "SandboxError", "message": str(e)}
        headers = {}
        if e.retry_after is not None:
            body["retry_after_s"] = round(e.retry_after, 3)
            headers["retry-after"] = str(max(1, int(e.retry_after + 0.999)))
        return JSONResponse(body, status_code=e.status, headers=headers)

    max_keys = cfg.max_files + cfg.max_env_vars + 64  # (a request's own fields on top)

    async def parse(request: Request, model):
        """The body as `model`: bounded in size (413) and time (408); more keys than the file and
        variable budgets allow are seen while it arrives and refused (422) unparsed (the rest is
        read and dropped); a large body is parsed off the event loop."""
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) > max_body:
            raise SessionError(413, f"request body larger than {max_body} bytes (--max-body-mb)")
        chunks, seen, keys, refused = [], 0, KeyBudget(max_keys), False
        try:
            async with asyncio.timeout(body_timeout):
                async for chunk in request.stream():
                    seen += len(chunk)
                    if seen > max_body:
                        raise SessionError(413, f"request body larger than {max_body} bytes (--max-body-mb)")
                    if not refused:
                        chunks.append(chunk)
                        if await keys.over_off_loop(chunks, False):
                            refused, chunks = True, []
                if not refused and chunks and await keys.over_off_loop(chunks + [b""], True):
                    refused, chunks = True, []
        except TimeoutError:
            raise SessionError(408, f"request body not received within {body_timeout:g}s (--body-timeout)") from None
        if refused:
            raise SessionError(
                422,
                f"invalid request: more than {max_keys} keys in the body (at most "
                f"{cfg.max_files} files and {cfg.max_env_vars} env variables)",
            )
        raw = b"".join(chunks) or b"{}"
        del chunks
        try:
            if len(raw) > 65536:
                return await asyncio.to_thread(model.model_validate_json, raw)
            return model.model_validate_json(raw)
        except ValidationError as e:
            fields = ", ".join(".".join(str(x) for x in d["loc"]) or "body" for d in e.errors())
            raise SessionError(
                422, f"invalid request: {fields}: " + "; ".join(d["msg"] for d in e.errors(include_url=False))
            ) from None

    def guarded(handler):
        async def route(request: Request):
            try:
                res = await handler(request)
            except SessionError as e:
                return error(e)
            return res if isinstance(res, Response) else JSONResponse(res)

        return route

    def session_spec(body) -> SessionSpec:
        files = {p: b64decode_field(v, f"files.{p}") for p, v in body.files.items()}
        tar = b64decode_field(body.tar, "tar") if body.tar is not None else None
        spec = SessionSpec(
            memory_mb=body.memory_mb,
            disk_mb=body.disk_mb,
            max_inodes=body.max_inodes,
            idle_timeout=body.idle_timeout,
            max_lifetime=body.max_lifetime,
            egress=body.egress,
            env=body.env,
            files=files,
            tar=tar,
        )
        try:
            check_files({inside_path(p): v for p, v in body.files.items()}, _budget(cfg, spec))
        except ValueError as e:
            raise SessionError(422, f"files: {e}") from None
        return spec

    async def open_session(request: Request):
        body = await parse(request, OpenSession)
        large = len(body.files) > 64 or len(body.tar or "") + sum(map(len, body.files.values())) > 65536
        spec = await asyncio.to_thread(session_spec, body) if large else session_spec(body)  # (decoding, checks)
        return (await table.open(spec)).info()

    async def list_sessions(request: Request):  # (no session ids: an id is the key to its session)
        listed = [{k: v for k, v in s.info().items() if k != "session_id"} for s in table.sessions.values()]
        return {
            "sessions": listed,
            "opened": table.opened,
            "closed_idle": table.closed_idle,
            "closed_lifetime": table.closed_lifetime,
            "failed": table.failed,
            "max_sessions": table.settings.max_sessions,
            "egress": sorted(table.settings.egress_targets),
        }

    async def get_session(request: Request):
        return table.get(request.path_params["sid"]).info()

    async def exec_command(request: Request):
        body = await parse(request, Exec)
        run = asyncio.ensure_future(
            table.exec(
                request.path_params["sid"],
                body.command,
                env=body.env,
                cwd=body.cwd,
                timeout=body.timeout,
                stdin=body.stdin.encode() if body.stdin is not None else None,
            )
        )
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait([run, gone], return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not run.done():  # its client went (or the server stops): the command stops, the session stays
                run.cancel()
                await asyncio.wait([run])
        if run.cancelled():
            return Response(status_code=499)  # (nobody reads it)
        out = run.result()
        text = (
            await asyncio.to_thread(json.dumps, out.as_dict()) if len(out.stdout) > 65536 else json.dumps(out.as_dict())
        )
        return Response(text, media_type="application/json")

    async def write_file(request: Request):
        body = await parse(request, WriteFile)
        data = (
            await asyncio.to_thread(b64decode_field, body.content, "content")
            if len(body.content) > 65536
            else b64decode_field(body.content, "content")
        )
        await table.write_file(request.path_params["sid"], body.path, data)
        return {"path": body.path}

    async def read_file(request: Request):
        path = request.query_params.get("path")
        if not path or "\x00" in path:
            raise SessionError(422, "invalid request: query.path is required and must not contain a NUL byte")
        data = await table.read_file(request.path_params["sid"], path)
        return {"path": path, "content": base64.b64encode(data).decode()}

    async def close_session(request: Request):
        sid = request.path_params["sid"]
        await table.close(sid)
        return {"closed": sid}

    app.router.add_route("/sessions", guarded(open_session), methods=["POST"])
    app.router.add_route("/sessions", guarded(list_sessions), methods=["GET"])
    app.router.add_route("/sessions/{sid}", guarded(get_session), methods=["GET"])
    app.router.add_route("/sessions/{sid}/exec", guarded(exec_command), methods=["POST"])
    app.router.add_route("/sessions/{sid}/files", guarded(write_file), methods=["PUT"])
    app.router.add_route("/sessions/{sid}/files", guarded(read_file), methods=["GET"])
    app.router.add_route("/sessions/{sid}", guarded(close_session), methods=["DELETE"])


async def _disconnected(request) -> None:
    """Returns when the client of `request` (its body read) goes away."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _budget(cfg, spec: SessionSpec):
    """The server's config with the session's disk and inode budget (for `check_files`)."""
    return dataclasses.replace(cfg, disk_mb=spec.disk_mb, max_inodes=spec.max_inodes)


def b64decode_field(value: str, field: str) -> bytes:
    try:
        return b64decode_pieces(value)
    except ValueError as e:
        raise SessionError(422, f"{field}: not base64 ({e})") from None
