"""Which class `slime.agent.sandboxes.sandbox.E2BSandbox` names: slime's E2B backend, or our own sandbox.

slime's coding-agent example imports `E2BSandbox` and calls `E2BSandbox(image)`. With
`SLIME_AGENT_SANDBOX_BACKEND=slime` (read when the name is imported: the example has no flag) it
is `SlimeImageSandbox`: a session of the `slime-sandbox` at `SLIME_AGENT_SANDBOX_URL`, whose one way
out is its egress `SLIME_AGENT_SANDBOX_EGRESS` (default `gateway`; empty: none), whose commands
start from `SLIME_AGENT_SANDBOX_ENV` (JSON, e.g. a PATH to CLIs bound with --ro-bind), and whose
`image` is a host directory or tarball unpacked into the workspace (`/tmp`): our sandbox has one
root (the host's `/usr`, read-only), so what an E2B image adds must come in as files.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

from slime.agent.sandboxes.sandbox_types import ExecResult, FileContent

BACKENDS = ("e2b", "slime")


@dataclasses.dataclass(frozen=True)
class SlimeBackendSettings:
    url: str
    egress: str | None = "gateway"
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # every command's base environment

    @classmethod
    def from_env(cls) -> SlimeBackendSettings:
        url = os.environ.get("SLIME_AGENT_SANDBOX_URL", "").strip()
        if not url:
            raise RuntimeError(
                "SLIME_AGENT_SANDBOX_BACKEND=slime needs SLIME_AGENT_SANDBOX_URL, the slime-sandbox "
                "server's URL (started with --egress gateway=127.0.0.1:<adapter port>)"
            )
        egress = os.environ.get("SLIME_AGENT_SANDBOX_EGRESS", "gateway").strip()
        raw = os.environ.get("SLIME_AGENT_SANDBOX_ENV", "").strip()
        try:
            env = json.loads(raw) if raw else {}
        except ValueError as e:
            raise RuntimeError(f"SLIME_AGENT_SANDBOX_ENV must be a JSON object of strings: {e}") from None
        if not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
            raise RuntimeError(f"SLIME_AGENT_SANDBOX_ENV must be a JSON object of strings, got {raw!r}")
        return cls(url=url, egress=egress or None, env=env)


def e2b_class() -> type:
    """The class `E2BSandbox` stands for, by `SLIME_AGENT_SANDBOX_BACKEND` (default `e2b`)."""
    backend = os.environ.get("SLIME_AGENT_SANDBOX_BACKEND", "e2b").strip() or "e2b"
    if backend == "e2b":
        from slime.agent.sandboxes.sandbox_e2b import E2BSandbox

        return E2BSandbox
    if backend == "slime":
        return SlimeImageSandbox
    raise ValueError(f"SLIME_AGENT_SANDBOX_BACKEND={backend!r}: expected one of {', '.join(BACKENDS)}")


def image_tarball(image: str) -> bytes | None:
    """The files an `image` stands for, as a plain tar: a host directory's contents or a tarball
    (gzipped or not); None for any other name (the session starts empty)."""
    path = Path(image)
    if path.is_file():
        data = path.read_bytes()
        return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data  # the server unpacks plain tars
    if not path.is_dir():
        return None
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        tar.add(path, arcname=".")
    return out.getvalue()


class SlimeImageSandbox:
    """`E2BSandbox(image)`'s shape on a `SlimeSandbox` session (see the module docstring)."""

    one_user = True  # `user="root"` and `"agent"` are the session's one uid (`ensure_agent_user`)

    def __init__(self, image: str, *, settings: SlimeBackendSettings | None = None) -> None:
        from slime.agent.sandboxes.sandbox_slime import SlimeSandbox

        self.image = image
        self.settings = settings or SlimeBackendSettings.from_env()
        self._sb = SlimeSandbox(
            self.settings.url, egress=self.settings.egress, tar=image_tarball(image), env=self.settings.env
        )

    @property
    def sandbox_id(self) -> str:
        return self._sb.sandbox_id

    @property
    def egress_url(self) -> str | None:
        return self._sb.egress_url

    async def __aenter__(self) -> SlimeImageSandbox:
        await self._sb.__aenter__()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self._sb.__aexit__(exc_type, exc, tb)

    async def exec(self, cmd: str, **kw: Any) -> ExecResult:
        return await self._sb.exec(cmd, **kw)

    async def write_file(self, sandbox_path: str, content: FileContent, **kw: Any) -> None:
        await self._sb.write_file(sandbox_path, content, **kw)

    async def read_file(self, sandbox_path: str, **kw: Any) -> str:
        return await self._sb.read_file(sandbox_path, **kw)

    async def exec_to_end(self, cmd: str, **kw: Any) -> int:
        """Spelled out, not left to `__getattr__`: from Python 3.12 `isinstance(sb, RunsToEnd)` looks
        attributes up statically, and without it `exec_and_wait` falls back to a detached spawn."""
        return await self._sb.exec_to_end(cmd, **kw)

    def __getattr__(self, name: str) -> Any:  # the backend's extras (`exec_to_end`, ...) pass through
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._sb, name)
