"""Nothing the command started outlives it: Ray's own processes included, whatever ends it.

Three measures, each for a way things leaked:
- The command leads its own process group when it is not an interactive foreground job. `timeout`
  and job runners signal their whole group: Ray's raylet died of that SIGTERM before our orderly
  stop could reach the engines through it. Now only the command gets the signal and stops
  everything in order (an interactive shell's Ctrl-C still reaches it as before).
- It is a child subreaper: a Ray agent whose parent died is re-parented to the command instead of
  init, and the command kills whatever of its descendants is still there when it ends.
- A lifeline process, forked before anything else, blocks on a pipe only the command holds: when
  the command dies by any means (SIGKILL included) the pipe closes and the lifeline kills the
  command's process group. It is only used when the command leads that group, so it never
  touches a pipeline it shares with others. A private Ray's processes are not in that group (a
  group SIGTERM must reach the command alone): their own keeper takes them down the same way
  (`slime.ray.process_keeper`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36


def _interactive_foreground() -> bool:
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def own_process_group() -> bool:
    """Lead a process group of our own (see module docstring); True if we lead one now."""
    if os.getpgrp() == os.getpid():
        return True
    if _interactive_foreground():
        return False
    try:
        os.setpgid(0, 0)
    except OSError:
        return False
    return True


def become_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except OSError:
        return False


def start_lifeline() -> int | None:
    """Fork the lifeline (call before any thread starts); its pid, or None when we do not lead our group."""
    if os.getpgrp() != os.getpid():
        return None
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the lifeline: no Python clean-up of the parent's state, ever
        try:
            os.close(write_end)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            while os.read(read_end, 1):
                pass
            os.killpg(os.getpgrp(), signal.SIGKILL)  # the command is gone: so is all it started
        finally:
            os._exit(0)
    os.close(read_end)
    os.set_inheritable(write_end, False)  # only this process holds the lifeline
    return pid


def kill_survivors(procs: list, timeout: float) -> list:
    """Wait up to `timeout` seconds for the psutil processes `procs` to end, SIGKILL the ones still
    alive and return those (the caller may wait for them to be reaped)."""
    import psutil

    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    return alive


def _running(p) -> bool:
    import psutil

    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # gone meanwhile
        return False


def _describe(p) -> str:
    """ "pid (command or name, status)" of a psutil process, as much of it as can still be read."""
    import psutil

    parts = []
    for what in (lambda: " ".join(p.cmdline()[:3])[:120], p.name, p.status):
        try:
            parts.append(what())
        except psutil.Error:
            continue
    return f"{p.pid} ({', '.join(x for x in parts if x)})"


def reap_exited() -> list[int]:
    """Collect every child that has already exited: as a subreaper we inherit the orphans of what we
    started (e.g. a Ray worker whose raylet stopped first), and their exit is ours to collect."""
    reaped = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        reaped.append(pid)
    return reaped


def reap_descendants(grace: float = 5.0, keep: tuple[int, ...] = ()) -> list[str]:
    """SIGTERM every descendant still running (then SIGKILL after `grace` seconds); each as "pid (name)".
    Descendants that already exited (zombies) are collected, not counted: they stopped in order."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil comes with Ray
        return []
    reap_exited()
    try:
        procs = [p for p in psutil.Process().children(recursive=True) if p.pid not in keep and _running(p)]
    except psutil.Error:
        return []
    names = [_describe(p) for p in procs]
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    psutil.wait_procs(kill_survivors(procs, grace), timeout=grace)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:  # reap zombies re-parented to us
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    return names
