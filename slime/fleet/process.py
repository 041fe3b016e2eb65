"""Server child processes: readiness probes with a deadline, log tails for errors, and dying
with the parent (Linux `PR_SET_PDEATHSIG`).

Engines and routers run in their own session (so a signal to the group reaches all of their
workers); without the death signal, a crashed or killed Ray actor would leave them running."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass


class ReadinessError(RuntimeError):
    """A server did not become ready (exited, or missed its deadline); carries its log tail."""


def wait_until(check, timeout: float, what: str, proc: subprocess.Popen | None = None,
               log_path: Path | None = None, interval: float = 0.05):
    """Probe `check()` until it returns a truthy value or the deadline passes.

    Readiness of another process has no event to wait on; a short probe interval with a hard
    deadline is the honest replacement for a fixed sleep. Fails fast if `proc` exits.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except requests.RequestException:
            pass
        if proc is not None and proc.poll() is not None:
            raise ReadinessError(f"{what}: process exited with code {proc.returncode}{log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise ReadinessError(f"{what}: not ready after {timeout:.0f}s{log_tail(log_path)}")
        time.sleep(interval)


def log_tail(path: Path | None, lines: int = 30) -> str:
    if path is None or not Path(path).exists():
        return ""
    text = Path(path).read_text(errors="replace").splitlines()[-lines:]
    return f"\n--- last {len(text)} lines of {path} ---\n" + "\n".join(text)
