"""`SlimeSandbox`: the `Sandbox` contract on our own sandbox server's sessions (`slime.sandbox.sessions`).

    async with SlimeSandbox(url, egress="gateway", files={"repo/a.py": "..."}) as sb:
        await sb.exec("python -m pytest -q", cwd="/tmp/repo", timeout=300)   # -> ExecResult
        await sb.write_file("/tmp/notes.txt", "hi");  await sb.read_file("/tmp/notes.txt")
        sb.egress_url        # "http://127.0.0.1:80": the gateway as the sandbox's programs reach it
        await sb.exec_to_end("bash /tmp/run.sh", time_budget_sec=600)   # `exec_and_wait` uses this

One session = one workspace kept across commands (``/tmp`` is the cwd, ``/home/agent`` is ``$HOME``;
``/mnt`` and ``/dev/shm`` are writable too; everything else is read-only) and at most one way out,
the named egress. Each command has a deadline and, when it ends, every process it started is
killed: a detached ``setsid ... &`` does not outlive its command, so long runs go through
`exec_to_end` (one command held to its end), not a spawn and a polled marker. Our sandbox never
runs as root: ``user="root"`` and ``user="agent"`` both run as the session's one uid. Timeouts give
return code 124 (as ``timeout(1)``) with the reason in stderr. Leaving the context (or `close`)
ends the session: its processes, workspace and egress go.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp

from slime.agent.sandboxes.sandbox_types import EXIT_TIME_BUDGET_EXCEEDED, ExecResult, FileContent

logger = logging.getLogger(__name__)
EXIT_TIMEOUT = 124  # a command past its deadline (as coreutils' `timeout`)
HTTP_MARGIN = 60.0  # seconds an HTTP call may take beyond the command's own deadline


class SandboxSessionError(RuntimeError):
    """The sandbox server refused or failed a session call; `status` is its HTTP status."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.retry_after = status, retry_after  # retry_after: seconds, the server's advice on 429


class SlimeSandbox:
    """A session on a `slime-sandbox` server at `url` (e.g. from `start_local_sandbox`).

    `egress` names one of the server's ``--egress`` targets; `files` (path -> content) and `tar`
    seed the workspace; `env` is every command's base environment; the limits left None take the
    server's defaults. Opening waits for a free slot (the server answers 429 with Retry-After)
    up to `open_timeout` seconds."""

    def __init__(
        self,
        url: str,
        *,
        egress: str | None = None,
        files: dict[str, FileContent] | None = None,
        tar: bytes | Path | None = None,
        env: dict[str, str] | None = None,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
        max_inodes: int | None = None,
        idle_timeout: float | None = None,
        max_lifetime: float | None = None,
        open_timeout: float = 120.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.egress, self.env = egress, dict(env or {})
        self._seed_files = dict(files or {})
        self._seed_tar = tar
        self._limits = {
            k: v
            for k, v in (
                ("memory_mb", memory_mb),
                ("disk_mb", disk_mb),
                ("max_inodes", max_inodes),
                ("idle_timeout", idle_timeout),
                ("max_lifetime", max_lifetime),
            )
            if v is not None
        }
        self.open_timeout = open_timeout
        self.sandbox_id = ""
        self.info: dict[str, Any] = {}
        self._http: aiohttp.ClientSession | None = None

    @property
    def egress_url(self) -> str | None:
        """The egress target's URL as programs inside this sandbox reach it (None: no egress)."""
        return self.info.get("egress_url")

    @property
    def workdir(self) -> str:
        return self.info.get("workdir", "/tmp")

    async def status(self) -> dict[str, Any]:
        """The session as the server sees it now (commands run, egress counters, limits); refreshes `info`."""
        self.info = await self._call("GET", f"/sessions/{self.sandbox_id}", timeout=HTTP_MARGIN)
        return self.info

    # -- lifecycle ---------------------------------------------------------------------------
    async def __aenter__(self) -> SlimeSandbox:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        try:
            await self._open()
        except BaseException:
            await self._http.close()
            self._http = None
            raise
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self.close()

    async def _open(self) -> None:
        body: dict[str, Any] = dict(self._limits, env=self.env, files={p: _b64(c) for p, c in self._seed_files.items()})
        if self.egress is not None:
            body["egress"] = self.egress
        if self._seed_tar is not None:
            body["tar"] = _b64(self._seed_tar)
        deadline = time.monotonic() + self.open_timeout
        while True:
            try:
                self.info = await self._call("POST", "/sessions", json=body, timeout=self.open_timeout + HTTP_MARGIN)
                break
            except SandboxSessionError as e:
                wait = e.retry_after
                if e.status != 429 or wait is None or time.monotonic() + wait > deadline:
                    raise
                logger.info("sandbox busy, opening the session again in %.1fs: %s", wait, e)
                await asyncio.sleep(wait)  # (the server's own estimate of when a slot frees)
        self.sandbox_id = self.info["session_id"]

    async def close(self) -> None:
        """End the session (idempotent); its processes, workspace and egress go."""
        http, self._http = self._http, None
        if http is None:
            return
        try:
            if self.sandbox_id:
                await self._call("DELETE", f"/sessions/{self.sandbox_id}", timeout=HTTP_MARGIN, http=http)
        except (SandboxSessionError, aiohttp.ClientError, asyncio.TimeoutError) as e:
            if getattr(e, "status", None) != 404:  # (404: expired already)
                logger.warning("closing sandbox session %s failed: %s (its idle deadline reaps it)", self.sandbox_id, e)
        finally:
            await http.close()

    # -- the Sandbox contract ------------------------------------------------------------------
    async def exec(
        self,
        cmd: str,
        *,
        user: str = "root",
        env: dict[str, str] | None = None,
        timeout: int = 120,
        check: bool = False,
        idempotent: bool = True,
        cwd: str | None = None,
        stdin: str | None = None,
    ) -> ExecResult:
        """Run `cmd` with bash in the workspace; `user` is ignored (one uid, never root); never
        re-sent (a local server: a failed call is reported, not repeated, so `idempotent` is moot)."""
        out = await self.exec_status(cmd, env=env, timeout=timeout, cwd=cwd, stdin=stdin)
        if out["status"] == "TimeLimitExceeded":
            res = ExecResult(EXIT_TIMEOUT, out["stdout"], out["stderr"] + f"\n[sandbox] {out['message']}\n")
        elif out["returncode"] is None:
            res = ExecResult(1, out["stdout"], out["stderr"] + f"\n[sandbox] {out['message']}\n")
        else:
            res = ExecResult(
                out["returncode"],
                out["stdout"],
                out["stderr"] + (f"\n[sandbox] {out['message']}\n" if out["message"] else ""),
            )
        if check and res.returncode != 0:
            raise RuntimeError(f"sandbox {self.sandbox_id}: exit {res.returncode}: {cmd[:120]}\n{res.stderr[-400:]}")
        return res

    async def exec_status(
        self,
        cmd: str,
        *,
        env: dict[str, str] | None = None,
        timeout: float = 120,
        cwd: str | None = None,
        stdin: str | None = None,
    ) -> dict[str, Any]:
        """The server's whole answer: status (Finished | TimeLimitExceeded | Error), returncode,
        stdout, stderr, execution_time, cpu_time, message."""
        body: dict[str, Any] = {"command": cmd, "env": env or {}, "timeout": timeout}
        if cwd is not None:
            body["cwd"] = cwd
        if stdin is not None:
            body["stdin"] = stdin
        return await self._call("POST", f"/sessions/{self.sandbox_id}/exec", json=body, timeout=timeout + HTTP_MARGIN)

    async def exec_to_end(
        self, cmd: str, *, time_budget_sec: float, user: str = "root", env: dict[str, str] | None = None
    ) -> int:
        """Run `cmd` held to its end within `time_budget_sec`: its exit code, or
        `EXIT_TIME_BUDGET_EXCEEDED` (`exec_and_wait`'s native path: no detached spawn, no polling)."""
        out = await self.exec_status(cmd, env=env, timeout=time_budget_sec)
        if out["status"] == "TimeLimitExceeded":
            return EXIT_TIME_BUDGET_EXCEEDED
        return out["returncode"] if out["returncode"] is not None else 1

    async def write_file(self, sandbox_path: str, content: FileContent, *, user: str = "root") -> None:
        await self._call(
            "PUT",
            f"/sessions/{self.sandbox_id}/files",
            json={"path": sandbox_path, "content": _b64(content)},
            timeout=HTTP_MARGIN * 2,
        )

    async def read_bytes(self, sandbox_path: str) -> bytes:
        got = await self._call(
            "GET", f"/sessions/{self.sandbox_id}/files", params={"path": sandbox_path}, timeout=HTTP_MARGIN * 2
        )
        return base64.b64decode(got["content"])

    async def read_file(self, sandbox_path: str, *, user: str = "root") -> str:
        """The file's text, or "" when it cannot be read (as `E2BSandbox`: a missing output file is
        not an error)."""
        try:
            return (await self.read_bytes(sandbox_path)).decode("utf-8", "replace")
        except SandboxSessionError as e:
            if e.status != 404:
                raise
            logger.debug("sandbox %s: read_file(%s): %s", self.sandbox_id, sandbox_path, e)
            return ""

    # -- HTTP --------------------------------------------------------------------------------
    async def _call(
        self, method: str, path: str, *, timeout: float, http: aiohttp.ClientSession | None = None, **kw: Any
    ) -> dict[str, Any]:
        http = http or self._http
        if http is None:
            raise SandboxSessionError(0, f"sandbox {self.sandbox_id or '(not opened)'}: use `async with` first")
        async with http.request(method, self.url + path, timeout=aiohttp.ClientTimeout(total=timeout), **kw) as r:
            try:
                data = await r.json(content_type=None)
            except ValueError:
                data = {"message": (await r.text())[:500]}
            if r.status != 200:
                raise SandboxSessionError(
                    r.status,
                    f"sandbox {method} {path}: HTTP {r.status}: {data.get('message')}",
                    data.get("retry_after_s"),
                )
            return data


def _b64(content: FileContent) -> str:
    if isinstance(content, Path):
        content = content.read_bytes()
    if isinstance(content, str):
        content = content.encode()
    return base64.b64encode(content).decode()
