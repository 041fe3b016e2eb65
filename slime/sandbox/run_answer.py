"""The init's answer to one run: read off the slot's stream, and turned into the `/run_code` response."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import struct
from dataclasses import dataclass
from typing import Any


@dataclass
class CommandResult:
    status: str  # Finished | Error | TimeLimitExceeded
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    cpu_time: float | None = None

    def as_dict(self) -> dict[str, Any]:  # (not dataclasses.asdict: it deep-copies, every run)
        return {
            "status": self.status,
            "execution_time": self.execution_time,
            "return_code": self.return_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "cpu_time": self.cpu_time,
        }


async def read_answer(loop: asyncio.AbstractEventLoop, sock: socket.socket):
    """The init's answer, ``<u32 n><JSON header><blobs>``; each blob read into its own buffer
    (no second copy of a large fetched file)."""
    pending = bytearray()

    async def take(n: int) -> bytearray:
        nonlocal pending
        if len(pending) >= n:
            out = pending[:n]
            del pending[:n]
            return out
        buf = bytearray(n)
        view = memoryview(buf)
        got = len(pending)
        view[:got] = pending
        pending = bytearray()
        while got < n:
            k = await loop.sock_recv_into(sock, view[got:])
            if not k:
                raise asyncio.IncompleteReadError(bytes(buf[:got]), n)
            got += k
        del view
        return buf  # (not copied into bytes: a fetched file may be tens of MB)

    first = await loop.sock_recv(sock, 1 << 16)
    if not first:
        raise asyncio.IncompleteReadError(b"", 4)
    pending += first
    (n,) = struct.unpack("!I", await take(4))
    res = json.loads(await take(n))
    steps = []
    for st in res.get("steps", []):
        out = await take(st["stdout_size"])
        steps.append((st, out, await take(st["stderr_size"])))
    files = [(path, await take(size)) for path, size in res.get("files", [])]
    return res, steps, files


async def run_response(res: dict[str, Any], steps, files) -> dict[str, Any]:
    """The `/run_code` answer (SandboxFusion's shape) from a whole answer of the init."""
    if res.get("setup_error"):
        return error_response(f"{res['setup_error']}; the code was not run")
    comp = rr = None
    notes = []
    memory_exceeded = False
    for st, out, err in steps:
        memory_exceeded |= bool(st.get("memory_exceeded"))
        r = CommandResult(
            status=st["status"],
            execution_time=st["execution_time"],
            return_code=st["return_code"],
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            cpu_time=st.get("cpu_time"),
        )
        if st.get("kind") == "compile":
            comp = r
        else:
            rr = r
        notes.extend(st.get("notes") or [])
    if sum(len(d) for _, d in files) > (1 << 20):
        enc = await asyncio.to_thread(lambda: {p: base64.b64encode(d).decode() for p, d in files})
    else:
        enc = {p: base64.b64encode(d).decode() for p, d in files}
    if res.get("not_fetched"):
        notes.append("not fetched: " + ", ".join(f"{name!r} ({why})" for name, why in res["not_fetched"]))
    if rr is None:
        msg = "compilation failed" + (f": {'; '.join(notes)}" if notes else "")
        return {
            "status": "Failed",
            "message": msg,
            "compile_result": comp.as_dict() if comp else None,
            "run_result": None,
            "executor_pod_name": None,
            "files": enc,
        }
    ok = rr.status == "Finished" and rr.return_code == 0 and not memory_exceeded
    msg = "" if ok or (memory_exceeded and rr.return_code == 0) else summary(rr)
    if notes:
        msg = "; ".join(notes) if not msg else f"{msg}: {'; '.join(notes)}"
    return {
        "status": "Success" if ok else "Failed",
        "message": msg,
        "compile_result": comp.as_dict() if comp else None,
        "run_result": rr.as_dict(),
        "executor_pod_name": None,
        "files": enc,
        "not_fetched": dict(res.get("not_fetched") or []),
    }


def summary(rr: CommandResult) -> str:
    if rr.status == "TimeLimitExceeded":
        return f"time limit exceeded after {rr.execution_time}s"
    if rr.status == "Error":
        return "the run was stopped"
    return f"process exited with return code {rr.return_code}"


def error_response(msg: str, status: str = "SandboxError") -> dict[str, Any]:
    return {
        "status": status,
        "message": msg,
        "compile_result": None,
        "run_result": None,
        "executor_pod_name": None,
        "files": {},
    }
