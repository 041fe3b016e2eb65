"""The `/run_code` request (SandboxFusion's fields): wrong types, unknown languages and
out-of-range limits answer 422 naming the field; a body-size limit answers 413."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from slime.sandbox.runner import SandboxConfig, normalize_path


def request_model(cfg: SandboxConfig, languages: list[str]) -> type[BaseModel]:
    langs = list(languages)

    class RunCodeRequest(BaseModel):
        model_config = ConfigDict(extra="ignore")  # SandboxFusion clients send fields we do not use

        code: str
        language: str = "python"
        compile_timeout: float | None = Field(None, gt=0, le=cfg.max_compile_timeout)
        run_timeout: float | None = Field(None, gt=0, le=cfg.max_run_timeout)
        memory_limit_MB: int | None = Field(None, le=cfg.max_memory_mb)  # -1/0: the default
        stdin: str | None = None
        files: dict[str, str | None] = Field(default_factory=dict)
        fetch_files: list[str] = Field(default_factory=list, max_length=10000)

        @field_validator("language")
        @classmethod
        def _language(cls, v: str) -> str:
            v = v.lower()
            if v not in langs:
                raise ValueError(f"language {v!r} is not supported here; supported: {', '.join(langs)}")
            return v

        @field_validator("memory_limit_MB")
        @classmethod
        def _memory(cls, v: int | None) -> int | None:
            if v is not None and 0 < v < cfg.min_memory_mb:
                raise ValueError(f"must be at least {cfg.min_memory_mb} MB (or -1 for the default)")
            return v

        @field_validator("files")
        @classmethod
        def _files(cls, v: dict[str, Any]) -> dict[str, Any]:
            for path in v:
                normalize_path(path)  # ValueError names the path
            return v

    return RunCodeRequest


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes gets 413 before it is read into memory."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers") or []:
            if k == b"content-length" and v.isdigit() and int(v) > self.limit:
                return await self._reject(send)
        chunks, seen = [], 0  # read it here (FastAPI reads it whole anyway), then replay it
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return
            chunks.append(msg.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.limit:
                return await self._reject(send)
            if not msg.get("more_body"):
                break
        body = b"".join(chunks)
        del chunks
        sent = False

        async def replay():
            nonlocal sent, body
            if not sent:
                sent = True
                out, body = body, b""
                return {"type": "http.request", "body": out, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, send) -> None:
        import json

        body = json.dumps({"status": "SandboxError", "detail": f"request body larger than {self.limit} bytes",
                           "message": f"request body larger than {self.limit} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
