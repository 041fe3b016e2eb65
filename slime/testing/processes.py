"""What a command started, and what of it is still running: for interrupt tests (tests only)."""

from __future__ import annotations

from pathlib import Path

import psutil


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def processes_naming(marker: str | Path) -> list[psutil.Process]:
    """Processes whose command line names `marker` (a run's own directory): ones that left the
    command's tree (re-parented away) but still belong to that run."""
    marker = str(marker)
    return [p for p in psutil.process_iter() if marker in cmdline(p)]


def survivors(started: list[psutil.Process], marker: str | Path, timeout: float = 60) -> list[str]:
    """Command lines of what is still running `timeout` s after the command ended: processes it had
    started, and any naming `marker`. They are killed, so a failed test leaves nothing behind."""
    _, alive = psutil.wait_procs(started, timeout=timeout)
    left = [cmdline(p) for p in alive] + [cmdline(p) for p in processes_naming(marker)]
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    return [c for c in left if c]
