"""Run untrusted code: one isolated run per request, bounded as a whole, on a slot of the `SlotPool`
(`slots.py`: the slots, their fork servers and their isolation). The request becomes the init's frame
(`run_plan.py`), the init's answer the `/run_code` response (`run_answer.py`).

Needs root (namespaces, mounts, uid switch, cgroups). `probe_isolation` checks once at start;
the server refuses to start without it unless ``--allow-no-isolation`` (then runs are only
rlimited, in host work dirs).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
from typing import Any

from slime.sandbox.config import PRELOAD, SandboxConfig
from slime.sandbox.languages import LANGUAGES, available_languages, find_python, run_env
from slime.sandbox.run_answer import CommandResult, error_response, run_response
from slime.sandbox.run_plan import normalize_path, plan_run
from slime.sandbox.slots import SandboxInternalError, SlotPool
from slime.sandbox.uids import UidRangeBusy

# the names this module had before it was split by idea (tests, bench and users import them from here)
_find_python, _run_env, _error = find_python, run_env, error_response
__all__ = [
    "PRELOAD",
    "LANGUAGES",
    "CommandResult",
    "IsolationUnavailable",
    "Runner",
    "SandboxConfig",
    "SandboxInternalError",
    "available_languages",
    "normalize_path",
    "probe_isolation",
]


class IsolationUnavailable(RuntimeError):
    pass


class Runner(SlotPool):
    """`run()` is one request, on a free slot."""

    def __init__(self, cfg: SandboxConfig) -> None:
        super().__init__(cfg)
        self.root: str | None = None  # host work dirs: only without isolation
        if not cfg.isolate:
            self.root = tempfile.mkdtemp(prefix="slime-sandbox-", dir=cfg.root_dir)
            os.chmod(self.root, 0o711)
        self.languages = available_languages(cfg)

    def close(self) -> None:
        super().close()
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)

    async def run(self, req: dict[str, Any]) -> dict[str, Any]:
        cfg = self.cfg
        lang = str(req.get("language") or "python").lower()
        if lang not in LANGUAGES or lang not in self.languages:
            return error_response(
                f"language {lang!r} is not supported here; supported: {', '.join(self.languages)}; the code was not run"
            )
        if self._closed:
            return error_response("the sandbox server is shutting down; the code was not run")
        slots = self._slots_q()
        slot = await slots.get()
        uid = self.uids.base + slot
        workdir = "/tmp"
        done = False
        try:
            if not cfg.isolate:
                workdir = tempfile.mkdtemp(prefix="run-", dir=self.root)
                with contextlib.suppress(OSError):
                    os.chown(workdir, uid, uid)
            rlimit_as = "memory" in self.per_process_only  # (a memory cgroup bounds memory, not address space)
            try:
                small = len(req.get("files") or ()) < 64 and len(req.get("code") or "") + len(
                    req.get("stdin") or ""
                ) + sum(len(v or "") for v in (req.get("files") or {}).values()) < (256 << 10)
                frame, budget, bad_fetch = (
                    plan_run(cfg, req, uid, workdir, rlimit_as)
                    if small
                    else await asyncio.to_thread(plan_run, cfg, req, uid, workdir, rlimit_as)
                )
            except (ValueError, TypeError) as e:
                done = True
                return error_response(f"bad input file: {e}", status="Failed")
            if self._closed:
                done = True
                return error_response("the sandbox server is shutting down; the code was not run")
            res, steps, files = await self.exchange(slot, frame, budget)
            done = not res.get("error")  # (an init that failed ends its slot: start a fresh one)
            res["not_fetched"] = bad_fetch + (res.get("not_fetched") or [])
            return await self._response(res, steps, files)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError, OSError) as e:
            return self._failed(f"{type(e).__name__}: {e}")
        except SandboxInternalError as e:
            return error_response(f"{e}; the code was not run")
        finally:
            if not done:
                z = self._zygotes[slot]
                if z is not None:  # whatever state it is in, a fresh fork server is the safe next step
                    z.broken = True
                    z.stop(grace=0)
            if not cfg.isolate and workdir != "/tmp":
                await asyncio.to_thread(shutil.rmtree, workdir, True)
            slots.put_nowait(slot)

    async def _response(self, res: dict[str, Any], steps, files) -> dict[str, Any]:
        if res.get("input_error"):
            return error_response(res["input_error"], status="Failed")
        if res.get("error"):
            return self._failed(res["error"])
        return await run_response(res, steps, files)

    def _failed(self, why: str) -> dict[str, Any]:
        if self._closed:  # (`stop_runs` killed its slot)
            return error_response(
                "the sandbox server stopped this run (its owner is gone, or it is shutting down); the code may have run"
            )
        return error_response(f"the run failed inside the sandbox: {why}; the code may have run")


def probe_isolation(cfg: SandboxConfig) -> None:
    """Start one isolated run; raise IsolationUnavailable with the reason if it cannot work."""
    problems = []
    if os.geteuid() != 0:
        problems.append("the sandbox server must run as root to create namespaces and drop to per-run uids")
    if not sys.platform.startswith("linux"):
        problems.append("Linux namespaces are required")
    py = cfg.python or find_python()
    if not py or not os.access(py, os.X_OK):
        problems.append(f"no interpreter to run the fork servers ({py})")
    if problems:
        raise IsolationUnavailable("; ".join(problems))

    async def probe() -> tuple[dict[str, Any], int]:
        try:
            r = Runner(dataclasses.replace(cfg, max_concurrency=1, isolate=True, preload=[], uid_base=None))
        except UidRangeBusy as e:
            raise IsolationUnavailable(str(e)) from e
        try:
            try:
                await r.start()
            except SandboxInternalError as e:
                raise IsolationUnavailable(str(e)) from e
            return r.uids.base, await r.run(
                {
                    "language": "python",
                    "run_timeout": 20,
                    "code": "import os\nprint(os.getuid(), os.getpid(), sorted(os.listdir('/sys/class/net')"
                    " if os.path.isdir('/sys/class/net') else []), open('/proc/net/dev').read().count(':'),"
                    " os.path.exists('/etc/shadow'))\nopen('/tmp/probe', 'w').write('x')",
                }
            )
        finally:
            r.close()

    uid_base, res = asyncio.run(probe())
    rr = res.get("run_result") or {}
    if res.get("status") != "Success":
        raise IsolationUnavailable(f"isolated probe failed: {res.get('message')} {rr.get('stderr', '')[-500:]}")
    uid, pid, *rest = rr["stdout"].split()
    n_if, shadow = rest[-2], rest[-1]
    if uid != str(uid_base):
        raise IsolationUnavailable(f"uid switch did not happen (got uid {uid!r})")
    if not pid.isdigit() or int(pid) <= 1:
        raise IsolationUnavailable(f"pid namespace missing or the program is its init (pid {pid!r})")
    if n_if != "1":
        raise IsolationUnavailable(f"network namespace sees {n_if} interfaces (expected only lo)")
    if shadow != "False":
        raise IsolationUnavailable("the host's /etc is visible in the run")
