"""`E2BSandbox`: slime's remote sandbox backend (the `e2b` package, imported on first use).

Every RPC that is safe to repeat is retried on transient transport errors with jittered
exponential backoff; a spawn marked non-idempotent is never re-sent. Settings are keywords; a
setting left None takes slime's environment variable (`SLIME_AGENT_SANDBOX_*`), read once in
`E2BSettings.from_env`, so slime's coding-agent example runs unchanged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
import os
import random
from pathlib import Path
from typing import Any, Awaitable, Callable

from slime.agent.sandboxes.sandbox_types import ExecResult, FileContent

logger = logging.getLogger(__name__)

_TRANSIENT = frozenset(
    {
        "ProtocolError",
        "LocalProtocolError",
        "WriteError",
        "ReadError",
        "ConnectError",
        "ConnectTimeout",
        "ReadTimeout",
        "WriteTimeout",
        "PoolTimeout",
        "RemoteProtocolError",
        "SSLError",
    }
)
BACKOFF_BASE, BACKOFF_CAP = 1.0, 32.0  # seconds


@dataclasses.dataclass(frozen=True)
class E2BSettings:
    image_metadata_key: str | None = None
    lifetime_sec: int = 3600
    rpc_retries: int = 6
    size: str = "md"

    @classmethod
    def from_env(cls) -> E2BSettings:
        def env(*names: str) -> str | None:
            return next((os.environ[n] for n in names if os.environ.get(n, "").strip()), None)

        d = cls()
        return cls(
            image_metadata_key=env("SLIME_AGENT_SANDBOX_IMAGE_METADATA_KEY", "SWE_SANDBOX_IMAGE_METADATA_KEY"),
            lifetime_sec=int(env("SLIME_AGENT_SANDBOX_LIFETIME_SEC", "SWE_SANDBOX_LIFETIME_SEC") or d.lifetime_sec),
            rpc_retries=int(env("SLIME_AGENT_SANDBOX_RPC_RETRIES", "SWE_RPC_RETRIES") or d.rpc_retries),
            size=env("SLIME_AGENT_E2B_SANDBOX_SIZE", "SWE_E2B_SANDBOX_SIZE") or d.size,
        )


def is_transient(e: BaseException) -> bool:
    name = type(e).__name__
    if name == "SandboxException":  # a dead sandbox stays dead
        return "does not exist" not in str(e) and "STOPPED state" not in str(e)
    return name in _TRANSIENT


class E2BSandbox:
    def __init__(self, image: str, *, settings: E2BSettings | None = None) -> None:
        self.image = image
        self.settings = settings or E2BSettings.from_env()
        self.sandbox_id = ""
        self._sb: Any = None

    async def _retry(self, what: str, call: Callable[[], Awaitable[Any]], *, idempotent: bool = True) -> Any:
        for attempt in range(self.settings.rpc_retries):
            try:
                return await call()
            except Exception as e:  # noqa: BLE001 - classified right below; the rest re-raise
                if not idempotent or not is_transient(e) or attempt + 1 >= self.settings.rpc_retries:
                    raise
                delay = random.uniform(0.0, min(BACKOFF_CAP, BACKOFF_BASE * 2**attempt))
                logger.debug("e2b %s: transient %s, retry %d in %.1fs", what, type(e).__name__, attempt + 1, delay)
                await asyncio.sleep(delay)
        raise RuntimeError(f"e2b {what}: rpc_retries is {self.settings.rpc_retries}; nothing was sent")

    async def __aenter__(self) -> E2BSandbox:
        key = self.settings.image_metadata_key
        if not key:
            raise RuntimeError(
                "E2BSandbox: no image metadata key; set E2BSettings.image_metadata_key or "
                "SLIME_AGENT_SANDBOX_IMAGE_METADATA_KEY to the key your E2B gateway routes images by"
            )
        from e2b import AsyncSandbox  # type: ignore[import-not-found]

        metadata = {key: self.image}
        if self.settings.size:
            metadata[f"{key.rsplit('/', 1)[0]}/size" if "/" in key else "size"] = self.settings.size
        self._sb = await self._retry(
            "create", lambda: AsyncSandbox.create(timeout=self.settings.lifetime_sec, metadata=metadata)
        )
        self.sandbox_id = self._sb.sandbox_id
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if self._sb is not None:
            try:
                await self._sb.kill()
            except Exception as e:  # noqa: BLE001 - the sandbox's lifetime reaps it anyway
                logger.warning("e2b kill %s failed: %s", self.sandbox_id, e)

    async def exec(
        self,
        cmd: str,
        *,
        user: str = "root",
        env: dict[str, str] | None = None,
        timeout: int = 120,
        check: bool = False,
        idempotent: bool = True,
    ) -> ExecResult:
        from e2b.sandbox.commands.command_handle import CommandExitException  # type: ignore[import-not-found]

        try:
            res = await self._retry(
                f"exec({cmd[:60]!r})",
                lambda: self._sb.commands.run(cmd, user=user, envs=env, timeout=timeout),
                idempotent=idempotent,
            )
            return ExecResult(res.exit_code, res.stdout or "", res.stderr or "")
        except CommandExitException as e:
            if check:
                raise RuntimeError(
                    f"e2b exec failed (exit {e.exit_code}): {cmd[:120]}\n{(e.stderr or '')[:400]}"
                ) from None
            return ExecResult(e.exit_code, e.stdout or "", e.stderr or "")

    async def write_file(self, sandbox_path: str, content: FileContent, *, user: str = "root") -> None:
        if isinstance(content, str):
            await self._retry(
                f"write_file({sandbox_path})", lambda: self._sb.files.write(sandbox_path, content, user=user)
            )
            return
        data = content.read_bytes() if isinstance(content, Path) else content
        await self._retry(
            f"write_file({sandbox_path})",
            lambda: self._sb.files.write(
                sandbox_path, io.BytesIO(data), user=user, gzip=False, use_octet_stream=True, request_timeout=600
            ),
        )

    async def read_file(self, sandbox_path: str, *, user: str = "root") -> str:
        """The file's text, or "" when it cannot be read (a missing output file is not an error)."""
        try:
            return await self._retry(f"read_file({sandbox_path})", lambda: self._sb.files.read(sandbox_path, user=user))
        except Exception as e:  # noqa: BLE001 - callers read optional files; the reason is logged
            logger.debug("e2b read_file(%s): %s", sandbox_path, e)
            return ""
