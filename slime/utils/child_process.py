"""One supervised child process: the router, every engine server and the local sandbox use it.

Why one class: each of them needs the same five things and got them slightly wrong when they
were written three times — its own session (a signal to the group reaches all its workers),
death with its parent (`PR_SET_PDEATHSIG`, so a killed Ray actor leaves nothing behind),
readiness probed against a deadline (there is no event to wait on in another process; a short
probe with a hard deadline replaces a fixed sleep), the log's tail in every start-up error, and
a stop that escalates from SIGTERM to SIGKILL on the whole group.

A `launcher` may replace the fork+exec (e.g. `slime.utils.fork_server.spawn`, a child forked warm
from a process that already imported and loaded everything): it gets the `ChildProcess` and returns
a Popen-like object (pid, poll, wait, returncode) of a child in its own session, or None to fall
back to the ordinary spawn; probing, logs and the escalating stop stay the same.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import requests

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """`preexec_fn`: the kernel SIGKILLs this child when the *thread* that forked it dies, so spawn
    from a thread that lives as long as the child (an actor's main thread, a watcher), never from a
    short-lived pool thread."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass


class ReadinessError(RuntimeError):
    """A child did not become ready (it exited, or missed its deadline); carries its log tail."""


def wait_until(
    check: Callable[[], Any],
    timeout: float,
    what: str,
    proc: subprocess.Popen | None = None,
    log_path: Path | None = None,
    interval: float = 0.05,
) -> Any:
    """Probe `check()` until it returns a truthy value or the deadline passes; fail fast if `proc` exits."""
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


# ports picked free and found taken by the time the server binds them (`listens_on`), before a start gives up
PORT_ATTEMPTS = 3


def start_picking_ports(start: Callable[[], Any], pick_again: Callable[[], bool]) -> Any:
    """`start()`; where it fails because its port was taken ("address already in use"), `pick_again()` and
    start again, up to PORT_ATTEMPTS starts. `pick_again` returns False when the ports are not the caller's
    to change (the user gave them): the error stands."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            return start()
        except ReadinessError as e:
            if attempt == PORT_ATTEMPTS or "address already in use" not in str(e).lower() or not pick_again():
                raise


def listens_on(pid: int | None, port: int) -> bool | None:
    """Whether process `pid`, or one of its descendants (a server whose listener runs in a child of the command),
    holds the listening TCP socket on `port` (Linux's `/proc`), None where that cannot be told. A port picked free
    can be taken by another process before our child binds it; that process may answer the readiness probe
    (another test's engine answers `/health` too) while our child fails to bind and exits."""
    if pid is None:
        return None
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{f[9]}]")
    if not os.path.isdir(f"/proc/{pid}/fd"):
        return None
    return any(_holds(p, inodes) for p in _with_descendants(pid))


def _with_descendants(pid: int) -> list[int]:
    """`pid` and every process below it (`/proc/<pid>/task/<tid>/children`)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                todo += [int(c) for c in Path(f"/proc/{p}/task/{tid}/children").read_text().split()]
            except (OSError, ValueError):
                continue
    return found


def _holds(pid: int, inodes: set[str]) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def http_ok(url: str) -> Callable[[], bool]:
    """A readiness check: `GET url` answers 200."""
    return lambda: requests.get(url, timeout=2).status_code == 200


class ChildProcess:
    """Start, probe, watch and stop one server process; output goes to `log_path`."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        name: str,
        log_path: Path,
        env: dict[str, str] | None = None,
        ready: Callable[[], Any] | None = None,
        startup_timeout: float = 60.0,
        pass_fds: Sequence[int] = (),
        launcher: Callable[["ChildProcess"], Any] | None = None,
        port: int | None = None,
    ):
        """`port`: the one the child listens on; `ready` counts only once the child itself holds it (`listens_on`)."""
        self.command, self.name, self.log_path = list(command), name, Path(log_path)
        self.env, self.ready, self.startup_timeout, self.pass_fds = env, ready, startup_timeout, tuple(pass_fds)
        self.launcher, self.port = launcher, port
        self.proc: Any = None  # subprocess.Popen, or what the launcher returned

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.launcher is not None:
            self.proc = self.launcher(self)  # None: the launcher cannot, start it the ordinary way
            if self.proc is not None:
                return
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=die_with_parent,
                pass_fds=self.pass_fds,
            )

    def start(self) -> "ChildProcess":
        """Spawn and wait until ready; on failure nothing is left running and the error has the log tail."""
        self.spawn()
        if self.ready is not None:
            try:
                wait_until(self._ready, self.startup_timeout, f"{self.name}", self.proc, self.log_path)
            except ReadinessError:
                self.kill()
                raise
        return self

    def _ready(self) -> Any:
        """`ready()`, counted only once the child itself holds `port` (when one is given)."""
        return self.ready() and (self.port is None or listens_on(self.pid, self.port) is not False)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self) -> int | None:
        """Block until the process exits (a watcher thread's way of hearing about a crash)."""
        return self.proc.wait() if self.proc else None

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """SIGKILL the whole group: what a crash looks like to everyone else."""
        if self.alive():
            self._signal_group(signal.SIGKILL)
            self.proc.wait()

    def ask_to_stop(self) -> None:
        """SIGTERM the group and return: `stop()` later waits for it (another stop can run meanwhile)."""
        if self.alive():
            self._signal_group(signal.SIGTERM)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the group, SIGKILL it if it is still there after `timeout`."""
        if not self.alive():
            return
        self._signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self) -> str:
        return log_tail(self.log_path)
