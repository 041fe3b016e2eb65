"""`RayProcessKeeper`: a private Ray's processes (GCS, raylet, monitors; the raylet's agents and
workers follow the raylet) lead sessions of their own, and a keeper process takes every process of those
sessions down when the command stops its Ray or dies, by whatever means.

Why sessions of their own: systemd, Slurm and `kill -TERM -PGID` signal the command's whole process
group. Ray's processes were in it: the GCS and raylet died of that SIGTERM at once, and the command's
orderly stop, which goes through them, waited 60 s before Ray's "Failed to connect to GCS within 60
seconds" ended it (rc 1, no stop line). Out of the group, only the command gets the signal and stops
everything in order (143), as for a SIGTERM to the command alone. Sessions, not one process group:
the raylet puts each worker in a process group of its own, never in a session of its own.

Why a keeper: out of the group, Ray's processes are also out of reach of the command's lifeline
(`slime.cli.lifeline`), which SIGKILLs the command's group when the command dies. Ray's kernel
fate-sharing (`PR_SET_PDEATHSIG`) takes the GCS and raylet with the command, not what the raylet
started: its agents outlived a SIGKILLed command. The keeper is started before Ray, in a session of its
own, and is told the id of each session a Ray process opens (the process's pid) over a pipe only the
command holds. When the pipe closes it SIGKILLs every process of those sessions, found by the session
id in `/proc/<pid>/stat` (which neither setproctitle nor an unreadable environment hides), pass after
pass until a pass finds none (one that forked while being killed adds a pass), then exits; the
command's stop waits for it. Run as a program (`python -I -S process_keeper.py FD`) it is the keeper:
standard library only, nothing of slime or Ray imported.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any, Iterator

logger = logging.getLogger("slime")


def stat_ids(stat: bytes) -> tuple[str, int, int]:
    """(state, process group, session) from a `/proc/<pid>/stat` line. The command name between the
    parentheses may hold spaces and parentheses itself: the fields are read after its last ')'."""
    fields = stat[stat.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[2]), int(fields[3])


def session_members(sessions: set[int], proc: str = "/proc") -> list[int]:
    """Pids of the live (not zombie) processes whose session is one of `sessions`."""
    found = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/stat", "rb") as f:
                state, _, session = stat_ids(f.read())
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
        if session in sessions and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def take_down_sessions(sessions: set[int], deadline: float) -> list[int]:
    """SIGKILL every process of `sessions` until a pass finds none, or `deadline` (a `time.monotonic()`
    value) passes; what was still there at the deadline."""
    pause = 0.001
    while True:
        left = session_members(sessions) if sessions else []
        if not left or time.monotonic() > deadline:
            return left
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(pause)  # a SIGKILLed process is gone within a scheduling round; then look again
        pause = min(pause * 2, 0.05)


def keep(read_fd: int, bound: float = 60.0) -> int:
    """The keeper: collect the session ids written to the pipe (one a line) until it closes, then take
    those sessions down; 0, or 1 if some process could not be killed within `bound` seconds (one stuck
    in the kernel)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # only the pipe's end ends it (SIGKILL aside)
        signal.signal(sig, signal.SIG_IGN)
    sessions: set[int] = set()
    pending = b""
    while chunk := os.read(read_fd, 4096):
        *lines, pending = (pending + chunk).split(b"\n")
        sessions.update(int(line) for line in lines if line.strip())
    left = take_down_sessions(sessions, time.monotonic() + bound)
    if left:
        print(f"ray process keeper: still running after {bound:.0f}s of SIGKILL: {left}", file=sys.stderr)
    return 1 if left else 0


class RayProcessKeeper:
    """The keeper, seen from the command: `start()` it before `ray.init`, let Ray start its processes
    `inside()` (each in a session of its own, told to the keeper), `stop()` it after `ray.shutdown()`
    (it returns once no process of those sessions is left)."""

    def __init__(self, keeper: subprocess.Popen, write_fd: int):
        self.keeper, self._write_fd = keeper, write_fd

    @classmethod
    def start(cls) -> RayProcessKeeper | None:
        """The keeper process; None where there is no `/proc` to find the sessions' processes in (Ray's
        processes then stay where Ray puts them)."""
        if not sys.platform.startswith("linux") or not os.path.isdir("/proc/self"):
            return None
        read_fd, write_fd = os.pipe()  # not inheritable: no process the command starts holds the pipe
        try:
            keeper = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(read_fd)],
                pass_fds=(read_fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )  # no group or terminal signal reaches it
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        return cls(keeper, write_fd)

    def adopt(self, session: int) -> None:
        """The keeper takes session `session` down with the others."""
        try:
            os.write(self._write_fd, f"{session}\n".encode())
        except OSError as e:  # the keeper was killed: a SIGKILLed command may leave Ray's agents behind
            logger.warning(
                "Ray's process keeper is gone (%s): session %d is not taken down with the command", e, session
            )

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """Every process Ray starts from this one during the block (`ray._private.services.ConsolePopen`:
        GCS, raylet, log monitor) leads a session of its own, adopted by the keeper."""
        import ray._private.services as services

        original = services.ConsolePopen
        keeper = self

        class OwnSessionPopen(original):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs["start_new_session"] = True
                super().__init__(*args, **kwargs)
                keeper.adopt(self.pid)  # a session's id is its leader's pid

        services.ConsolePopen = OwnSessionPopen
        try:
            yield
        finally:
            services.ConsolePopen = original

    def stop(self, timeout: float = 90.0) -> None:
        """Close the pipe and wait for the keeper to have taken the sessions down (its own bound is 60 s)."""
        if self._write_fd >= 0:
            os.close(self._write_fd)
            self._write_fd = -1
        try:
            self.keeper.wait(timeout)
        except subprocess.TimeoutExpired:
            self.keeper.kill()
            self.keeper.wait()


if __name__ == "__main__":
    sys.exit(keep(int(sys.argv[1])))
