"""One slot's fork server (`zygote.py`) seen from the server: its sources, its start-up config, its handle,
and the socket waits on it and on its init."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
from typing import Any

from slime.sandbox.cgroups import SlotCgroup
from slime.sandbox.config import SandboxConfig
from slime.sandbox.languages import run_env
from slime.sandbox.ro_binds import with_interpreter

HERE = os.path.dirname(os.path.abspath(__file__))
# what the fork server loads (stdlib only), each after those it imports (`zygote._load_siblings`)
SLOT_MODULES = (
    "isolation",
    "program",
    "slot_session",
    "run_frames",
    "run_files",
    "run_memory",
    "ns_dropper",
    "run_init",
)


def slot_sources() -> tuple[bytes, dict[str, str]]:
    """The fork server's script (sent on its stdin) and the modules it loads (sent with its
    config): no file of this checkout is opened, nor its path shown, inside a slot."""

    def read(name: str) -> str:
        with open(os.path.join(HERE, name + ".py")) as f:
            return f.read()

    return read("zygote").encode(), {n: read(n) for n in SLOT_MODULES}


def fork_server_config(cfg: SandboxConfig, uid: int, cg: SlotCgroup | None, sources: dict[str, str]) -> dict[str, Any]:
    """What the fork server of one slot builds its isolation from (sent once, as JSON)."""
    return {
        "isolate": cfg.isolate,
        "uid": uid,
        "ro_binds": with_interpreter(cfg.ro_binds, cfg.python),
        "disk_mb": cfg.disk_mb,
        "max_inodes": cfg.max_inodes,
        "env": run_env(),
        "preload": cfg.preload,
        "cg_procs": cg.procs if cg else [],
        "cg_sup_procs": cg.sup_procs if cg else [],
        "cg_enable": cg.enable if cg else [],
        "cg_run_procs": cg.run_procs if cg else [],
        "cg_limits": cg.limits if cg else [],
        "cg_oom": cg.oom if cg else [],
        "cg_usage": cg.usage if cg else [],
        "sources": sources,
        # set once on the fork server (root: RLIMIT_NPROC never binds its own forks)
        "limits": {
            "max_processes": cfg.max_processes,
            "max_file_mb": cfg.max_file_mb,
            "max_open_files": cfg.max_open_files,
        }
        if cfg.isolate
        else None,
    }


class ForkServer:
    """Handle of one slot's fork server."""

    def __init__(self, proc: subprocess.Popen, ctl: socket.socket, data: socket.socket) -> None:
        self.proc, self.ctl = proc, ctl
        self.data = data  # the slot's request stream: one request, then its answer, at a time
        self.frame_sent: asyncio.Event | None = None  # set once the current request is wholly sent (`stop_program`)
        self.base_bytes = 0
        self.broken = False

    def alive(self) -> bool:
        return not self.broken and self.proc.poll() is None

    def stop(self, grace: float = 2.0) -> None:
        """EOF on its sockets ends its init (a run still going is killed, and the namespace goes),
        then it; kill if stuck."""
        with contextlib.suppress(OSError):
            self.data.close()
        with contextlib.suppress(OSError):
            self.ctl.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(grace)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


async def recv_msg(sock: socket.socket, with_fds: bool = False) -> tuple[bytes, list[int]]:
    loop = asyncio.get_running_loop()
    fd = sock.fileno()  # (the socket may be closed meanwhile: the reader is removed by this number)
    while True:
        try:
            if with_fds:
                msg, fds, _flags, _addr = socket.recv_fds(sock, 65536, 4)
                return msg, fds
            return sock.recv(65536), []
        except BlockingIOError:
            pass
        fut = loop.create_future()
        loop.add_reader(fd, lambda: fut.done() or fut.set_result(None))
        try:
            await fut
        finally:
            loop.remove_reader(fd)


async def wait_fd(fd: int, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    loop.add_reader(fd, lambda: fut.done() or fut.set_result(None))
    try:
        await asyncio.wait_for(fut, timeout)
        return True
    except asyncio.TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)


def init_pidfd(zygote_pid: int) -> int | None:
    """A pidfd of the slot's init (the fork server's child that is PID 1 of its namespace): it is
    readable once the init is gone, and the kernel ends an init only after every other process of
    its namespace (so: after all of a session's processes)."""
    try:
        with open(f"/proc/{zygote_pid}/task/{zygote_pid}/children") as f:
            kids = [int(p) for p in f.read().split()]
        for pid in kids:
            with open(f"/proc/{pid}/status") as f:
                if any(line.startswith("NSpid:") and line.split()[-1] == "1" for line in f):
                    return os.pidfd_open(pid)
    except (OSError, ValueError):
        pass
    return None
