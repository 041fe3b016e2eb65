"""A `/run_code` request as the frame its slot's init reads: ``<u32 n><JSON header><files><code><stdin>``."""

from __future__ import annotations

import base64
import json
import os
import struct
from typing import Any

from slime.sandbox.config import SandboxConfig
from slime.sandbox.languages import LANGUAGES, run_env


B64_PIECE = 1 << 20  # base64 characters decoded at once (a multiple of 4)


def b64decode_pieces(text: str) -> bytes:
    """`text` decoded (strict base64) a piece at a time: each piece is one call holding the interpreter,
    so a thread decoding 26 MB lets the event loop run between pieces (one call would hold it 0.5 s
    on a busy host). ValueError (binascii.Error) for what is not base64."""
    if len(text) <= B64_PIECE:
        return base64.b64decode(text, validate=True)
    return b"".join([base64.b64decode(text[i : i + B64_PIECE], validate=True) for i in range(0, len(text), B64_PIECE)])


def normalize_path(path: str) -> str:
    """A request path (relative, or under /tmp: the work dir) as a clean relative path; one under
    /mnt (the run's own, on its tmpfs, as in SandboxFusion) as ``/mnt/<clean relative path>``."""
    if not path or "\x00" in path:
        raise ValueError(f"invalid path {path!r}")
    if path.startswith("/mnt/"):
        return "/mnt/" + normalize_path(path[len("/mnt/") :])
    rel = path[len("/tmp/") :] if path.startswith("/tmp/") else path
    if os.path.isabs(rel):
        raise ValueError(f"absolute path outside the work dir: {path!r}")
    norm = os.path.normpath(rel)
    if norm in (".", "..") or norm.startswith("../"):
        raise ValueError(f"path escapes the work dir: {path!r}")
    return norm


def plan_run(
    cfg: SandboxConfig, req: dict[str, Any], uid: int, workdir: str, rlimit_as: bool
) -> tuple[bytes, float, list[list[str]]]:
    """The request frame for the run's init, its time budget, and the fetch paths refused (built off
    the event loop when large: decoding, many files). `rlimit_as`: no memory cgroup, so the address
    space is what bounds memory."""
    lang = str(req.get("language") or "python").lower()
    src_name, comp_argv, run_argv = LANGUAGES[lang]
    run_timeout = float(req.get("run_timeout") or 10)
    compile_timeout = float(req.get("compile_timeout") or 10)
    mem = req.get("memory_limit_MB")
    mem_mb = cfg.default_memory_mb if mem is None or int(mem) <= 0 else int(mem)
    steps = []
    if comp_argv:
        steps.append(
            {
                "argv": comp_argv,
                "timeout": compile_timeout,
                "cpu_s": max(1, int(compile_timeout + 0.999)),
                "mem_mb": max(mem_mb, cfg.compile_memory_mb),
                "kind": "compile",
                "rlimit_as": rlimit_as,
            }
        )
    warm = run_argv[0] == "{py}"
    steps.append(
        {
            "argv": [cfg.python or "python3", *run_argv[1:]] if warm else run_argv,
            "warm_python": warm,
            "timeout": run_timeout,
            "cpu_s": max(1, int(run_timeout + 0.999)),
            "mem_mb": mem_mb,
            "stdin": True,
            "kind": "run",
            "rlimit_as": rlimit_as,
        }
    )
    files, blobs = [], []
    for path, b64 in (req.get("files") or {}).items():
        data = b64decode_pieces(b64 or "")
        files.append([normalize_path(path), len(data)])
        blobs.append(data)
    code = str(req.get("code") or "").encode()
    stdin = req.get("stdin")
    stdin_b = stdin.encode() if isinstance(stdin, str) else None
    fetch, bad_fetch = [], []
    for p in req.get("fetch_files") or []:
        try:
            fetch.append([str(p), normalize_path(str(p))])
        except ValueError as e:
            bad_fetch.append([str(p), str(e)])
    hdr = {
        "uid": uid,
        "workdir": workdir,
        "env": run_env() if cfg.isolate else dict(run_env(), HOME=workdir, TMPDIR=workdir),
        "disk_mb": cfg.disk_mb,
        "files": files,
        "source": src_name,
        "code_size": len(code),
        "stdin_size": len(stdin_b) if stdin_b is not None else -1,
        "steps": steps,
        "fetch": fetch,
        "fetch_max_file": min(cfg.max_file_mb, cfg.max_fetch_mb) << 20,
        "fetch_max_total": cfg.max_fetch_mb << 20,
        "max_output": cfg.max_output_bytes,
        "max_processes": cfg.max_processes,
        "max_file_mb": cfg.max_file_mb,
        "max_open_files": cfg.max_open_files,
    }
    head = json.dumps(hdr).encode()
    return (
        b"".join([struct.pack("!I", len(head)), head, *blobs, code, stdin_b or b""]),
        sum(s["timeout"] for s in steps) + 30,
        bad_fetch,
    )
