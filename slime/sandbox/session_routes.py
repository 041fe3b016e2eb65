"""The session API over HTTP (`sessions.py` does the work):

    POST   /sessions                  {memory_mb, disk_mb, max_inodes, idle_timeout, max_lifetime,
                                       egress, env, files: {path: base64}, tar: base64}  -> the session
    GET    /sessions                  open sessions and counters
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

from slime.sandbox.schema import check_files
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
Env = Annotated[dict[str, str], AfterValidator(env_vars)]


def _models(cfg, settings: SessionSettings):
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

    async def parse(request: Request, model):
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) > max_body:
            raise SessionError(413, f"request body larger than {max_body} bytes (--max-body-mb)")
        chunks, seen = [], 0
        try:
            async with asyncio.timeout(body_timeout):
                async for chunk in request.stream():
                    seen += len(chunk)
                    if seen > max_body:
                        raise SessionError(413, f"request body larger than {max_body} bytes (--max-body-mb)")
                    chunks.append(chunk)
        except TimeoutError:
            raise SessionError(408, f"request body not received within {body_timeout:g}s (--body-timeout)") from None
        try:
            return model.model_validate_json(b"".join(chunks) or b"{}")
        except ValidationError as e:
            fields = ", ".join(".".join(str(x) for x in d["loc"]) or "body" for d in e.errors())
            raise SessionError(422, f"invalid request: {fields}: "
                                    + "; ".join(d["msg"] for d in e.errors(include_url=False))) from None

    def guarded(handler):
        async def route(request: Request):
            try:
                res = await handler(request)
            except SessionError as e:
                return error(e)
            return res if isinstance(res, Response) else JSONResponse(res)
        return route

    async def open_session(request: Request):
        body = await parse(request, OpenSession)
        files = {p: b64decode_field(v, f"files.{p}") for p, v in body.files.items()}
        tar = b64decode_field(body.tar, "tar") if body.tar is not None else None
        spec = SessionSpec(memory_mb=body.memory_mb, disk_mb=body.disk_mb, max_inodes=body.max_inodes,
                           idle_timeout=body.idle_timeout, max_lifetime=body.max_lifetime, egress=body.egress,
                           env=body.env, files=files, tar=tar)
        try:
            check_files({inside_path(p): v for p, v in body.files.items()}, _budget(cfg, spec))
        except ValueError as e:
            raise SessionError(422, f"files: {e}") from None
        return (await table.open(spec)).info()

    async def list_sessions(request: Request):
        return {"sessions": [s.info() for s in table.sessions.values()], "opened": table.opened,
                "closed_idle": table.closed_idle, "closed_lifetime": table.closed_lifetime, "failed": table.failed,
                "max_sessions": table.settings.max_sessions,
                "egress": sorted(table.settings.egress_targets)}

    async def get_session(request: Request):
        return table.get(request.path_params["sid"]).info()

    async def exec_command(request: Request):
        body = await parse(request, Exec)
        out = await table.exec(request.path_params["sid"], body.command, env=body.env, cwd=body.cwd,
                               timeout=body.timeout, stdin=body.stdin.encode() if body.stdin is not None else None)
        text = await asyncio.to_thread(json.dumps, out.as_dict()) if len(out.stdout) > 65536 \
            else json.dumps(out.as_dict())
        return Response(text, media_type="application/json")

    async def write_file(request: Request):
        body = await parse(request, WriteFile)
        await table.write_file(request.path_params["sid"], body.path, b64decode_field(body.content, "content"))
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


def _budget(cfg, spec: SessionSpec):
    """The server's config with the session's disk and inode budget (for `check_files`)."""
    return dataclasses.replace(cfg, disk_mb=spec.disk_mb, max_inodes=spec.max_inodes)


def b64decode_field(value: str, field: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as e:
        raise SessionError(422, f"{field}: not base64 ({e})") from None
