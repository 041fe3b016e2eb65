"""The `/run_code` request (SandboxFusion's fields): wrong types, unknown languages,
out-of-range limits, files that are not base64 and files that cannot fit a run's tmpfs answer 422
naming the field."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from slime.sandbox.config import SandboxConfig
from slime.sandbox.run_plan import b64decode_pieces, normalize_path


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
        files: dict[str, str | None] = Field(default_factory=dict, max_length=cfg.max_files)
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
            check_files(v, cfg)
            return v

    return RunCodeRequest


def check_files(files: dict[str, Any], cfg: SandboxConfig) -> None:
    """The request's files must fit a run's tmpfs: paths inside it, files and their directories
    within its inodes, contents within its size, and no path both a file and a directory."""
    paths: dict[str, str] = {}
    for path in files:
        norm = normalize_path(path)  # ValueError names the path
        if norm in paths:
            raise ValueError(f"{path!r} and {paths[norm]!r} are the same file")
        paths[norm] = path
    for path, content in files.items():
        try:
            b64decode_pieces(content or "")
        except ValueError as e:
            raise ValueError(f"the content of {path!r} is not base64 ({e})") from None
    dirs = {d for norm in paths for d in _parents(norm)}
    clash = dirs.intersection(paths)
    if clash:
        d = min(clash)
        child = next(p for n, p in paths.items() if n.startswith(d + "/"))
        raise ValueError(f"{paths[d]!r} is a file, and a directory of {child!r}")
    if len(paths) + len(dirs) > cfg.max_inodes - 64:
        raise ValueError(f"{len(paths)} files in {len(dirs)} directories exceed the run's {cfg.max_inodes - 64} inodes")
    size = sum(len(b or "") for b in files.values()) * 3 // 4
    if size > cfg.disk_mb << 20:
        raise ValueError(f"about {size >> 20} MB of files exceed the run's {cfg.disk_mb} MB disk")


def _parents(norm: str):
    while "/" in norm:
        norm = norm.rsplit("/", 1)[0]
        yield norm


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"\s*(:?)')


def count_keys(raw: bytes, enough: int) -> int:
    """Keys of the JSON document `raw`, counted up to `enough` + 1 (a scan of its strings, not a
    parse: stops early, so a body of millions of files is refused in milliseconds)."""
    n = 0
    for m in _STRING.finditer(raw):
        if m.group(1):
            n += 1
            if n > enough:
                break
    return n


class KeyBudget:
    """The keys of a JSON body counted while it arrives, so a body of millions of keys is refused
    before the rest of it comes (and long before a parse, which would hold the interpreter for
    seconds). `over(chunks, last)` after each chunk: True once more than `enough` keys are in. A
    colon count bounds the keys from above; the scan runs when it doubles, and at the last chunk."""

    def __init__(self, enough: int) -> None:
        self.enough, self.colons, self.next_scan = enough, 0, enough

    def over(self, chunks: list[bytes], last: bool) -> bool:
        return self._due(chunks[-1], last) and count_keys(b"".join(chunks), self.enough) > self.enough

    async def over_off_loop(self, chunks: list[bytes], last: bool) -> bool:
        """`over`, its scan (a Python loop over up to `enough` keys: 0.1 s for 60,000 on a busy
        host) in a thread, so that the event loop gets the interpreter back every few milliseconds."""
        if not self._due(chunks[-1], last):
            return False
        raw = b"".join(chunks)
        n = await asyncio.to_thread(count_keys, raw, self.enough) if len(raw) > 65536 else count_keys(raw, self.enough)
        return n > self.enough

    def _due(self, chunk: bytes, last: bool) -> bool:
        self.colons += chunk.count(b":")
        if self.colons <= self.enough or (self.colons <= self.next_scan and not last):
            return False
        self.next_scan = 2 * self.colons
        return True


class RequestParser:
    """Body bytes -> the request as a dict, or its errors (``[{"loc", "msg", "type"}]``, loc starting
    with "body"). Too many keys for the file budget are refused from a scan (`budget`, while the
    body arrives), before a parse that would take seconds; a large body is parsed off the event loop."""

    def __init__(self, cfg: SandboxConfig, languages: list[str]) -> None:
        self.model = request_model(cfg, languages)
        self.max_files = cfg.max_files

    def budget(self) -> KeyBudget:
        return KeyBudget(self.max_files + 64)  # (the request's own keys on top)

    def too_many_keys(self) -> list[dict[str, Any]]:
        return [
            {
                "loc": ["body", "files"],
                "msg": f"at most {self.max_files} files (the run's inode budget)",
                "type": "too_long",
            }
        ]

    async def __call__(self, raw: bytes) -> dict[str, Any] | list[dict[str, Any]]:
        """(Its keys were counted while it arrived: `budget`, `endpoint.py`.)"""
        return await asyncio.to_thread(self._validate, raw) if len(raw) > 65536 else self._validate(raw)

    def _validate(self, raw: bytes) -> dict[str, Any] | list[dict[str, Any]]:
        try:
            return self.model.model_validate_json(raw).model_dump()
        except ValidationError as e:
            return [
                {"loc": ["body", *err["loc"]], "msg": err["msg"], "type": err["type"]}
                for err in e.errors(include_url=False, include_context=False, include_input=False)
            ]
