"""The sandbox contract agent harnesses run in, and the detached-command transport over it.

`Sandbox` is what a backend provides: async context manager, `exec`, `write_file`, `read_file`.
`exec_and_wait` runs a long command through short idempotent calls only (write a launcher, spawn
it detached, poll its exit-code marker), because a remote sandbox's gateway severs long streams
and a severed spawn must not run twice; a backend that can hold a command to its end (`RunsToEnd`:
our own sandbox, `sandbox_slime.py`) runs the launcher that way instead. `E2BSandbox` (slime's
backend, or ours with SLIME_AGENT_SANDBOX_BACKEND=slime: `sandbox_backend.py`) loads lazily, so the
`e2b` package is needed only by whoever uses it; the backends import the values they exchange from
`sandbox_types.py`, not this module, so naming them here closes no import circle. (The code stays in
this module, not behind a re-export: slime's own tests patch its `asyncio`.)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol, runtime_checkable

from slime.agent.sandboxes.sandbox_types import EXIT_TIME_BUDGET_EXCEEDED, ExecResult, FileContent

__all__ = [
    "EXIT_TIME_BUDGET_EXCEEDED",
    "MARKER_POLL_SECONDS",
    "ExecResult",
    "FileContent",
    "RunsToEnd",
    "Sandbox",
    "ensure_agent_user",
    "exec_and_wait",
]  # and E2BSandbox, on access only (a star import loads no backend)

MARKER_POLL_SECONDS = 5  # a remote sandbox has no completion event: its marker is polled this often


@runtime_checkable
class Sandbox(Protocol):
    """`idempotent` tells a backend with transport retries whether re-sending is safe."""

    sandbox_id: str

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, exc_type, exc, tb) -> None: ...

    async def exec(
        self,
        cmd: str,
        *,
        user: str = "root",
        env: dict[str, str] | None = None,
        timeout: int = 120,
        check: bool = False,
        idempotent: bool = True,
    ) -> ExecResult: ...

    async def write_file(self, sandbox_path: str, content: FileContent, *, user: str = "root") -> None: ...

    async def read_file(self, sandbox_path: str, *, user: str = "root") -> str: ...


@runtime_checkable
class RunsToEnd(Protocol):
    """A backend that can hold one command to its end (a local sandbox: no gateway severs it);
    `exec_and_wait` then runs the launcher through it instead of a detached spawn and a polled marker."""

    async def exec_to_end(
        self, cmd: str, *, time_budget_sec: float, user: str = "root", env: dict[str, str] | None = None
    ) -> int: ...


async def _await_done_marker(sb: Sandbox, done_file: str, *, user: str, time_budget_sec: float) -> int:
    """The exit code a detached command wrote to `done_file`, or EXIT_TIME_BUDGET_EXCEEDED. The
    short polls double as the keep-alive that stops a remote sandbox from being reaped as idle."""
    deadline = time.time() + time_budget_sec
    while time.time() < deadline:
        await asyncio.sleep(MARKER_POLL_SECONDS)
        code, out, _ = await sb.exec(f"test -f {done_file} && cat {done_file}", user=user, timeout=15)
        if code == 0 and out.strip():
            return int(out.strip())
    return EXIT_TIME_BUDGET_EXCEEDED


async def exec_and_wait(
    sb: Sandbox,
    *,
    cmd: str,
    time_budget_sec: float,
    tag: str,
    user: str = "root",
    env: dict[str, str] | None = None,
    workdir: str | None = None,
    out_file: str | None = None,
    want_output: bool = False,
) -> tuple[int, str]:
    """Run `cmd` detached to completion: (exit code, its whole output if `want_output`, else the
    last 512 bytes of it on failure). Two calls with one `tag` must not overlap.

    The previous run of `tag` is cleared in its own call before the spawn: the spawn's
    `mkdir` lock only dedupes a replay of this one spawn, and a lock surviving into the next run
    would skip it and hand back the old exit code."""
    out_file = out_file or f"/tmp/.{tag}.out"
    done_file, launcher, lock_dir = f"/tmp/.{tag}.done", f"/tmp/.{tag}.sh", f"/tmp/.{tag}.spawned"
    prefix = f"cd {workdir}\nexport HOME=/home/{user}\n" if workdir else ""
    await sb.write_file(launcher, f"#!/bin/bash\n{prefix}{cmd}\necho $? > {done_file}\n", user=user)
    await sb.exec(f"rm -rf {lock_dir}; rm -f {out_file} {done_file}", user=user, timeout=30, check=True)
    if isinstance(sb, RunsToEnd):  # (the launcher ends with the marker's echo: its code is the marker's)
        code = await sb.exec_to_end(
            f"bash {launcher} < /dev/null > {out_file} 2>&1; rc=$?; "
            f"test -s {done_file} && exit $(cat {done_file}); exit $rc",
            time_budget_sec=time_budget_sec,
            user=user,
            env=env,
        )
    else:
        await sb.exec(
            f"chmod +x {launcher}; mkdir {lock_dir} 2>/dev/null || exit 0; "
            f"setsid bash {launcher} < /dev/null > {out_file} 2>&1 &",
            user=user,
            env=env,
            timeout=30,
            check=True,
        )
        code = await _await_done_marker(sb, done_file, user=user, time_budget_sec=time_budget_sec)
    if want_output:
        return code, await sb.read_file(out_file, user=user)
    if code == 0:
        return code, ""
    _, tail, _ = await sb.exec(f"tail -c 512 {out_file} 2>/dev/null", user=user, timeout=15)
    return code, tail or ""


async def ensure_agent_user(sb: Sandbox, workdir: str) -> None:
    """The unprivileged `agent` user owns `workdir` and may run git in any directory. A backend
    whose commands all run as one unprivileged uid (`one_user = True`: ours) has nobody to create:
    `workdir` is made and git trusts every directory for that uid."""
    if getattr(sb, "one_user", False):
        await sb.exec(f"mkdir -p {workdir} && git config --global --add safe.directory '*'", check=True, timeout=60)
        return
    await sb.exec(
        f"id agent >/dev/null 2>&1 || useradd -m -s /bin/bash agent && "
        f"chown -R agent:agent /home/agent {workdir} && "
        f"git config --system --add safe.directory '*' && id agent",
        user="root",
        check=True,
        timeout=60,
    )


def __getattr__(name: str) -> Any:
    if name == "E2BSandbox":  # lazily: importing the contract must not need the e2b backend
        from slime.agent.sandboxes.sandbox_backend import e2b_class

        return e2b_class()  # slime's E2B backend, or ours (SLIME_AGENT_SANDBOX_BACKEND=slime)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
