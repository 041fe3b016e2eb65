"""Slots: the server keeps one per unit of concurrency, lent to one run or one session at a time; a slot
is a uid, cgroups, and three processes, all run by the *run* interpreter (stdlib only):

- `zygote.py`, the fork server: loads the interpreter and common modules, builds the slot's
  isolation once (`isolation.py`, `cgroups.py`: the slot's cgroups for processes and CPU, and for
  the memory incl. tmpfs of all processes of a run together, which it and the init stay out of; a
  network namespace with only loopback, up; a read-only minimal root with ``/usr`` and the
  interpreters, a synthetic ``/etc``, nothing of the host's data), then forks every program of the
  slot inside the run's namespaces, idle in between;
- `run_init.py` (with `run_frames.py`, `run_files.py`, `run_memory.py`, `ns_dropper.py`), PID 1 of the
  slot's PID namespace: keeps the next run's mount and IPC namespaces with a size-limited tmpfs as
  ``/tmp`` and ``/dev/shm`` ready before the request comes, writes the request's files, has each
  step forked, reaps, enforces the timeout and the output limit, kills every process of the run
  when the program ends, reports, and drops the namespaces;
- `program.py`, in the forked program: joins the run's cgroup, takes its pipes, the run's rlimits and
  the slot's uid (``no_new_privs``, the seccomp filter, the run-independent rlimits, umask and the
  empty group list are the fork server's, set once); then Python code runs in this already warm
  interpreter (as ``python3 -u main.py`` would), other languages exec their tools.

A request goes to its slot's init over the slot's stream (one socket pair for the slot's life),
the answer comes back on it; a run that ends otherwise (timeout, cancel, error) ends its slot.

Nothing outlives the server: fork servers die with it (pdeathsig + EOF on their control socket),
their inits with them (pdeathsig; they never change credentials), every process of a PID
namespace with its init, and a run's tmpfs with its mount namespace.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess

from slime.sandbox.cgroups import Cgroups
from slime.sandbox.config import SandboxConfig
from slime.sandbox.fork_server import ForkServer, fork_server_config, init_pidfd, recv_msg, slot_sources, wait_fd
from slime.sandbox.languages import find_python, run_env
from slime.sandbox.run_answer import read_answer
from slime.sandbox.run_frames import STOP
from slime.sandbox.uids import FIRST_UID, UidRange

logger = logging.getLogger(__name__)


class SandboxInternalError(RuntimeError):
    pass


class SlotPool:
    """Owns the slots (uid, cgroup, fork server each): starts and ends them, lends them to a run
    (`exchange`) or to a session (`take_slot` ... `end_slot`)."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        cfg.python = cfg.python or find_python()
        self.uids = (
            UidRange.claim(cfg.max_concurrency, cfg.uid_base)
            if cfg.isolate
            else UidRange(cfg.uid_base or FIRST_UID, cfg.max_concurrency, [])
        )
        self.cgroups = (
            Cgroups(cfg.max_concurrency, cfg.max_processes + 4, cfg.cpus_per_run) if cfg.isolate else Cgroups(0, 0, 0)
        )
        if cfg.isolate and self.cgroups.missing:
            logger.warning(
                "cgroups unavailable for %s: those limits are per process only (rlimits)",
                ", ".join(self.cgroups.missing),
            )
        self.seccomp = False
        self._zygote_script, self._slot_modules = slot_sources()
        self._zygotes: list[ForkServer | None] = [None] * cfg.max_concurrency
        self._slots: asyncio.Queue[int] | None = None
        self._closed = False

    @property
    def per_process_only(self) -> list[str]:
        """Limits that hold per process only (no cgroup controller for them)."""
        return list(self.cgroups.missing) if self.cfg.isolate else ["memory", "processes", "cpu", "disk"]

    # -- fork servers ----------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.gather(*(self._spawn(i) for i in range(self.cfg.max_concurrency)))

    async def _spawn(self, slot: int) -> ForkServer:
        cfg = self.cfg
        old = self._zygotes[slot]
        if old is not None:
            old.stop()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        data, data_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cg = self.cgroups.slots[slot] if slot < len(self.cgroups.slots) else None
        conf = fork_server_config(cfg, self.uids.base + slot, cg, self._slot_modules)
        py = os.path.realpath(cfg.python or "/usr/bin/python3")
        # started from the event loop's thread: the pdeathsig it sets is tied to a thread that lives
        try:
            proc = subprocess.Popen(
                [py, "-I", "-B", "-", str(theirs.fileno()), str(data_theirs.fileno())],
                pass_fds=(theirs.fileno(), data_theirs.fileno()),
                env=run_env(),
                cwd="/",
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL if cfg.isolate else None,
                start_new_session=True,
            )
            with proc.stdin:  # (a pipe holds 64 KiB: written from a thread, the loop never blocks)
                await asyncio.to_thread(proc.stdin.write, self._zygote_script)
        except BaseException:
            for sock in (mine, data):
                sock.close()
            raise
        finally:
            theirs.close()
            data_theirs.close()
        mine.setblocking(False)
        data.setblocking(False)
        z = ForkServer(proc, mine, data)
        self._zygotes[slot] = z
        try:
            mine.send(json.dumps(conf).encode())
            msg, _ = await asyncio.wait_for(recv_msg(mine), 60)
            ready = json.loads(msg or b'{"ready": false, "error": "exited"}')
        except (OSError, asyncio.TimeoutError, ValueError) as e:
            ready = {"ready": False, "error": f"{type(e).__name__}: {e}"}
        if not ready.get("ready"):
            z.stop()
            raise SandboxInternalError(f"the fork server of slot {slot} failed to start: {ready.get('error')}")
        z.base_bytes = ready.get("base_bytes", 0)
        self.seccomp = bool(ready.get("seccomp"))
        return z

    @property
    def running(self) -> int:
        q = self._slots
        return self.cfg.max_concurrency - (q.qsize() if q is not None else self.cfg.max_concurrency)

    def stop_runs(self) -> None:
        """End every running run now (their slots' processes are killed) and refuse new ones."""
        self._closed = True
        for z in self._zygotes:
            if z is not None and z.proc.poll() is None:
                z.broken = True
                z.proc.kill()  # its init dies with it (pdeathsig), and with the init every process of the run:
                # a run's request then ends with the stream's EOF (its socket stays open until then)

    def close(self) -> None:
        self._closed = True
        for z in self._zygotes:
            if z is not None:
                z.stop()
        self.cgroups.close()
        self.uids.release()

    def _slots_q(self) -> asyncio.Queue[int]:
        if self._slots is None:
            self._slots = asyncio.Queue()
            for i in range(self.cfg.max_concurrency):
                self._slots.put_nowait(i)
        return self._slots

    async def exchange(self, slot: int, frame: bytes, budget: float):
        """One request frame to `slot`'s init, its answer back, within `budget` seconds. Anything else
        than a whole answer (timeout, cancel, error) must end the slot (`end_slot`): its stream
        closes, the init kills a run still going, and the next request gets a fresh slot."""
        z = self._zygotes[slot]
        if z is None or not z.alive():
            z = await self._spawn(slot)
        loop = asyncio.get_running_loop()
        z.frame_sent = sent = asyncio.Event()
        async with asyncio.timeout(budget):  # (no extra task per run, unlike wait_for)
            await loop.sock_sendall(z.data, frame)
            sent.set()
            del frame
            return await read_answer(loop, z.data)

    async def stop_program(self, slot: int, exchange: asyncio.Future) -> None:
        """Ask `slot`'s init to stop the program it runs for `exchange` (its answer then comes as usual,
        saying so; a session keeps its slot): once the request is wholly sent, never inside it. A stop
        after the program's end is dropped by the init."""
        z = self._zygotes[slot]
        sent = z.frame_sent
        if sent is None:
            return
        waiter = asyncio.ensure_future(sent.wait())
        try:
            await asyncio.wait([waiter, exchange], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if sent.is_set() and not exchange.done():
            await asyncio.get_running_loop().sock_sendall(z.data, STOP)

    async def receive_fds(self, slot: int, timeout: float) -> tuple[bytes, list[int]]:
        """A message with fds from `slot`'s init on its control socket (a session's egress listener)."""
        return await asyncio.wait_for(recv_msg(self._zygotes[slot].ctl, with_fds=True), timeout)

    def take_slot(self) -> int | None:
        """A free slot now, held until `end_slot` (a session's), or None."""
        if self._closed:
            return None
        try:
            return self._slots_q().get_nowait()
        except asyncio.QueueEmpty:
            return None

    async def end_slot(self, slot: int) -> None:
        """End everything of `slot` (its processes, namespaces, tmpfs) and give it back; the next
        request there gets a fresh fork server."""
        z = self._zygotes[slot]
        if z is not None:
            z.broken = True
            init = init_pidfd(z.proc.pid)
            try:
                await asyncio.to_thread(z.stop, 2.0)
                if init is not None and not await wait_fd(init, 30):
                    logger.warning("slot %d: its init outlived its fork server by 30s", slot)
            finally:
                if init is not None:
                    os.close(init)
        self._slots_q().put_nowait(slot)
