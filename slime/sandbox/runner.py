"""Run untrusted code: one isolated run per request, bounded as a whole, served by warm fork servers.

The server keeps one slot per unit of concurrency; a slot is three processes, all run by the
*run* interpreter (stdlib only):

- `zygote.py`, the fork server: loads the interpreter and common modules, builds the slot's
  isolation once (`isolation.py`, `cgroups.py`: the slot's cgroups for processes and CPU, and for
  the memory incl. tmpfs of all processes of a run together, which it and the init stay out of; a network namespace with only loopback, up; a read-only
  minimal root with ``/usr`` and the interpreters, a synthetic ``/etc``, nothing of the host's
  data), then forks every program of the slot inside the run's namespaces, idle in between;
- `run_init.py`, PID 1 of the slot's PID namespace: keeps the next run's mount and IPC namespaces
  with a size-limited tmpfs as ``/tmp`` and ``/dev/shm`` ready before the request comes, writes
  the request's files, has each step forked, reaps, enforces the timeout and the output limit,
  kills every process of the run when the program ends, reports, and drops the namespaces;
- `program.py`, in the forked program: joins the run's cgroup, takes its pipes, the run's rlimits and the slot's uid
  (``no_new_privs``, the seccomp filter, the run-independent rlimits, umask and the empty group
  list are the fork server's, set once); then Python code runs in this already warm interpreter
  (as ``python3 -u main.py`` would), other languages exec their tools.

A request goes to its slot's init over the slot's stream (one socket pair for the slot's life),
the answer comes back on it; a run that ends otherwise (timeout, cancel, error) ends its slot.

Nothing outlives the server: fork servers die with it (pdeathsig + EOF on their control socket),
their inits with them (pdeathsig; they never change credentials), every process of a PID
namespace with its init, and a run's tmpfs with its mount namespace.

Needs root (namespaces, mounts, uid switch, cgroups). `probe_isolation` checks once at start;
the server refuses to start without it unless ``--allow-no-isolation`` (then runs are only
rlimited, in host work dirs).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

from slime.sandbox.cgroups import Cgroups
from slime.sandbox.uids import FIRST_UID, UidRange, UidRangeBusy

logger = logging.getLogger(__name__)
HERE = os.path.dirname(os.path.abspath(__file__))


def slot_sources() -> tuple[bytes, dict[str, str]]:
    """The fork server's script (sent on its stdin) and the modules it loads (sent with its
    config): no file of this checkout is opened, nor its path shown, inside a slot."""
    def read(name: str) -> str:
        with open(os.path.join(HERE, name + ".py")) as f:
            return f.read()
    return read("zygote").encode(), {n: read(n) for n in ("isolation", "program", "slot_session", "run_init")}
# Modules a run's Python finds already imported. Each one costs every run a little (the fork server's
# memory is copied and torn down per run); these are the common, cheap ones of generated solutions.
# Heavier, rarer ones (dataclasses, statistics, decimal, datetime, threading, numpy) load on use, and
# `random` too (preloaded, it would reseed itself after every fork).
PRELOAD = ["re", "math", "json", "collections", "itertools", "functools", "heapq", "bisect", "string",
           "typing", "copy", "operator", "array", "struct", "time", "resource", "types", "builtins", "atexit"]


class IsolationUnavailable(RuntimeError):
    pass


class SandboxInternalError(RuntimeError):
    pass


@dataclass
class SandboxConfig:
    max_concurrency: int = 4
    isolate: bool = True  # False only with --allow-no-isolation
    uid_base: int | None = None  # first run uid; None: the first free range (`uids.py`)
    python: str | None = None  # interpreter for `python` (runs the fork servers too)
    root_dir: str | None = None
    default_memory_mb: int = 512
    min_memory_mb: int = 32
    max_memory_mb: int = 4096
    max_run_timeout: float = 120.0
    max_compile_timeout: float = 60.0
    max_output_bytes: int = 1 << 20  # per stream
    max_processes: int = 128  # processes and threads of a run (ThreadPoolExecutor(64) must start)
    max_file_mb: int = 64
    disk_mb: int = 256  # the run's tmpfs (/tmp and /dev/shm together)
    max_open_files: int = 256
    cpus_per_run: float = 1.0  # cgroup CPU bandwidth: CPU time of a run <= wall time x this
    max_body_mb: int = 32
    max_inodes: int = 65536  # of a run's tmpfs
    max_files: int = 60000  # request files (with their directories, within max_inodes)
    max_fetch_mb: int = 64  # total of fetched files per request
    compile_memory_mb: int = 1024
    ro_paths: list[str] = field(default_factory=list)  # more read-only paths in the runs' root
    ro_binds: list[list[str]] = field(default_factory=list)  # [host, inside] read-only binds (`ro_binds.py`)
    preload: list[str] = field(default_factory=lambda: list(PRELOAD))


@dataclass
class CommandResult:
    status: str  # Finished | Error | TimeLimitExceeded
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    cpu_time: float | None = None

    def as_dict(self) -> dict[str, Any]:  # (not dataclasses.asdict: it deep-copies, every run)
        return {"status": self.status, "execution_time": self.execution_time, "return_code": self.return_code,
                "stdout": self.stdout, "stderr": self.stderr, "cpu_time": self.cpu_time}


def _find_python() -> str | None:
    for p in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if os.path.exists(p):
            return os.path.realpath(p)
    return None


LANGUAGES = {
    # language -> (source file, compile argv or None, run argv); "{py}" runs in the warm interpreter
    "python": ("main.py", None, ["{py}", "main.py"]),
    "python3": ("main.py", None, ["{py}", "main.py"]),
    "bash": ("main.sh", None, ["/bin/bash", "main.sh"]),
    "sh": ("main.sh", None, ["/bin/sh", "main.sh"]),
    "cpp": ("main.cpp", ["g++", "-O2", "-std=c++17", "-o", "main", "main.cpp"], ["./main"]),
    "c": ("main.c", ["gcc", "-O2", "-o", "main", "main.c", "-lm"], ["./main"]),
}


def available_languages(cfg: SandboxConfig) -> list[str]:
    out = []
    for lang, (_, comp, run) in LANGUAGES.items():
        if run[0] == "{py}" and not (cfg.python or _find_python()):
            continue
        if comp and not shutil.which(comp[0]):
            continue
        out.append(lang)
    return out


def _run_env() -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def normalize_path(path: str) -> str:
    """A request path (relative, or under /tmp: the work dir) as a clean relative path; one under
    /mnt (the run's own, on its tmpfs, as in SandboxFusion) as ``/mnt/<clean relative path>``."""
    if not path or "\x00" in path:
        raise ValueError(f"invalid path {path!r}")
    if path.startswith("/mnt/"):
        return "/mnt/" + normalize_path(path[len("/mnt/"):])
    rel = path[len("/tmp/"):] if path.startswith("/tmp/") else path
    if os.path.isabs(rel):
        raise ValueError(f"absolute path outside the work dir: {path!r}")
    norm = os.path.normpath(rel)
    if norm in (".", "..") or norm.startswith("../"):
        raise ValueError(f"path escapes the work dir: {path!r}")
    return norm


class _Zygote:
    """Handle of one slot's fork server."""

    def __init__(self, proc: subprocess.Popen, ctl: socket.socket, data: socket.socket) -> None:
        self.proc, self.ctl = proc, ctl
        self.data = data  # the slot's request stream: one request, then its answer, at a time
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


async def _recv_msg(sock: socket.socket, with_fds: bool = False) -> tuple[bytes, list[int]]:
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


async def _wait_fd(fd: int, timeout: float) -> bool:
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


def _init_pidfd(zygote_pid: int) -> int | None:
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


class Runner:
    """Owns the slots (uid, cgroup, fork server each); `run()` is one request."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        cfg.python = cfg.python or _find_python()
        self.root: str | None = None  # host work dirs: only without isolation
        if not cfg.isolate:
            self.root = tempfile.mkdtemp(prefix="slime-sandbox-", dir=cfg.root_dir)
            os.chmod(self.root, 0o711)
        self.languages = available_languages(cfg)
        self.uids = UidRange.claim(cfg.max_concurrency, cfg.uid_base) if cfg.isolate else \
            UidRange(cfg.uid_base or FIRST_UID, cfg.max_concurrency, [])
        self.cgroups = Cgroups(cfg.max_concurrency, cfg.max_processes + 4, cfg.cpus_per_run) if cfg.isolate \
            else Cgroups(0, 0, 0)
        if cfg.isolate and self.cgroups.missing:
            logger.warning("cgroups unavailable for %s: those limits are per process only (rlimits)",
                           ", ".join(self.cgroups.missing))
        self.seccomp = False
        self._zygote_script, self._slot_modules = slot_sources()
        self._zygotes: list[_Zygote | None] = [None] * cfg.max_concurrency
        self._slots: asyncio.Queue[int] | None = None
        self._closed = False

    @property
    def per_process_only(self) -> list[str]:
        """Limits that hold per process only (no cgroup controller for them)."""
        return list(self.cgroups.missing) if self.cfg.isolate else ["memory", "processes", "cpu", "disk"]

    # -- fork servers ----------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.gather(*(self._spawn(i) for i in range(self.cfg.max_concurrency)))

    async def _spawn(self, slot: int) -> _Zygote:
        cfg = self.cfg
        old = self._zygotes[slot]
        if old is not None:
            old.stop()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        data, data_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cg = self.cgroups.slots[slot] if slot < len(self.cgroups.slots) else None
        ro = [p for p in cfg.ro_paths]
        py = os.path.realpath(cfg.python or "/usr/bin/python3")
        if not py.startswith("/usr/"):  # an interpreter outside /usr brings its prefix along
            ro.append(os.path.dirname(os.path.dirname(py)))
        conf = {"isolate": cfg.isolate, "uid": self.uids.base + slot, "ro_paths": ro, "ro_binds": cfg.ro_binds,
                "disk_mb": cfg.disk_mb,
                "max_inodes": cfg.max_inodes,
                "env": _run_env(), "preload": cfg.preload,
                "cg_procs": cg.procs if cg else [], "cg_sup_procs": cg.sup_procs if cg else [],
                "cg_enable": cg.enable if cg else [], "cg_run_procs": cg.run_procs if cg else [],
                "cg_limits": cg.limits if cg else [], "cg_oom": cg.oom if cg else [],
                "cg_usage": cg.usage if cg else [], "sources": self._slot_modules,
                # set once on the fork server (root: RLIMIT_NPROC never binds its own forks)
                "limits": {"max_processes": cfg.max_processes, "max_file_mb": cfg.max_file_mb,
                           "max_open_files": cfg.max_open_files} if cfg.isolate else None}
        # started from the event loop's thread: the pdeathsig it sets is tied to a thread that lives
        try:
            proc = subprocess.Popen([py, "-I", "-B", "-", str(theirs.fileno()), str(data_theirs.fileno())],
                                    pass_fds=(theirs.fileno(), data_theirs.fileno()), env=_run_env(), cwd="/",
                                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL if cfg.isolate else None, start_new_session=True)
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
        z = _Zygote(proc, mine, data)
        self._zygotes[slot] = z
        try:
            mine.send(json.dumps(conf).encode())
            msg, _ = await asyncio.wait_for(_recv_msg(mine), 60)
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
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)

    def _slots_q(self) -> asyncio.Queue[int]:
        if self._slots is None:
            self._slots = asyncio.Queue()
            for i in range(self.cfg.max_concurrency):
                self._slots.put_nowait(i)
        return self._slots

    # -- one request ---------------------------------------------------------------------
    def _plan(self, req: dict[str, Any], uid: int, workdir: str) -> tuple[bytes, float]:
        """The request frame for the run's init (built off the event loop: decoding, many files)."""
        cfg = self.cfg
        lang = str(req.get("language") or "python").lower()
        src_name, comp_argv, run_argv = LANGUAGES[lang]
        run_timeout = float(req.get("run_timeout") or 10)
        compile_timeout = float(req.get("compile_timeout") or 10)
        mem = req.get("memory_limit_MB")
        mem_mb = cfg.default_memory_mb if mem is None or int(mem) <= 0 else int(mem)
        rlimit_as = "memory" in self.per_process_only  # (a memory cgroup bounds memory, not address space)
        steps = []
        if comp_argv:
            steps.append({"argv": comp_argv, "timeout": compile_timeout, "cpu_s": max(1, int(compile_timeout + 0.999)),
                          "mem_mb": max(mem_mb, cfg.compile_memory_mb), "kind": "compile", "rlimit_as": rlimit_as})
        warm = run_argv[0] == "{py}"
        steps.append({"argv": [cfg.python or "python3", *run_argv[1:]] if warm else run_argv, "warm_python": warm,
                      "timeout": run_timeout, "cpu_s": max(1, int(run_timeout + 0.999)), "mem_mb": mem_mb,
                      "stdin": True, "kind": "run", "rlimit_as": rlimit_as})
        files, blobs = [], []
        for path, b64 in (req.get("files") or {}).items():
            data = base64.b64decode(b64 or "", validate=True)
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
        hdr = {"uid": uid, "workdir": workdir, "env": _run_env() if cfg.isolate else dict(_run_env(), HOME=workdir,
                                                                                        TMPDIR=workdir),
               "disk_mb": cfg.disk_mb, "files": files, "source": src_name, "code_size": len(code),
               "stdin_size": len(stdin_b) if stdin_b is not None else -1, "steps": steps, "fetch": fetch,
               "fetch_max_file": min(cfg.max_file_mb, cfg.max_fetch_mb) << 20,
               "fetch_max_total": cfg.max_fetch_mb << 20,
               "max_output": cfg.max_output_bytes, "max_processes": cfg.max_processes,
               "max_file_mb": cfg.max_file_mb, "max_open_files": cfg.max_open_files}
        head = json.dumps(hdr).encode()
        return b"".join([struct.pack("!I", len(head)), head, *blobs, code, stdin_b or b""]), \
            sum(s["timeout"] for s in steps) + 30, bad_fetch

    async def run(self, req: dict[str, Any]) -> dict[str, Any]:
        cfg = self.cfg
        lang = str(req.get("language") or "python").lower()
        if lang not in LANGUAGES or lang not in self.languages:
            return _error(f"language {lang!r} is not supported here; supported: {', '.join(self.languages)}; "
                          "the code was not run")
        if self._closed:
            return _error("the sandbox server is shutting down; the code was not run")
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
            try:
                small = len(req.get("files") or ()) < 64 and len(req.get("code") or "") + len(req.get("stdin") or "") \
                    + sum(len(v or "") for v in (req.get("files") or {}).values()) < (256 << 10)
                frame, budget, bad_fetch = self._plan(req, uid, workdir) if small else \
                    await asyncio.to_thread(self._plan, req, uid, workdir)
            except (ValueError, TypeError) as e:
                done = True
                return _error(f"bad input file: {e}", status="Failed")
            if self._closed:
                done = True
                return _error("the sandbox server is shutting down; the code was not run")
            res, steps, files = await self.exchange(slot, frame, budget)
            done = not res.get("error")  # (an init that failed ends its slot: start a fresh one)
            res["not_fetched"] = bad_fetch + (res.get("not_fetched") or [])
            return await self._response(res, steps, files)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError, OSError) as e:
            return self._failed(f"{type(e).__name__}: {e}")
        except SandboxInternalError as e:
            return _error(f"{e}; the code was not run")
        finally:
            if not done:
                z = self._zygotes[slot]
                if z is not None:  # whatever state it is in, a fresh fork server is the safe next step
                    z.broken = True
                    z.stop(grace=0)
            if not cfg.isolate and workdir != "/tmp":
                await asyncio.to_thread(shutil.rmtree, workdir, True)
            slots.put_nowait(slot)

    async def exchange(self, slot: int, frame: bytes, budget: float):
        """One request frame to `slot`'s init, its answer back, within `budget` seconds. Anything else
        than a whole answer (timeout, cancel, error) must end the slot (`end_slot`): its stream
        closes, the init kills a run still going, and the next request gets a fresh slot."""
        z = self._zygotes[slot]
        if z is None or not z.alive():
            z = await self._spawn(slot)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(budget):  # (no extra task per run, unlike wait_for)
            await loop.sock_sendall(z.data, frame)
            del frame
            return await self._read_result(loop, z.data)

    async def receive_fds(self, slot: int, timeout: float) -> tuple[bytes, list[int]]:
        """A message with fds from `slot`'s init on its control socket (a session's egress listener)."""
        return await asyncio.wait_for(_recv_msg(self._zygotes[slot].ctl, with_fds=True), timeout)

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
            init = _init_pidfd(z.proc.pid)
            try:
                await asyncio.to_thread(z.stop, 2.0)
                if init is not None and not await _wait_fd(init, 30):
                    logger.warning("slot %d: its init outlived its fork server by 30s", slot)
            finally:
                if init is not None:
                    os.close(init)
        self._slots_q().put_nowait(slot)

    @staticmethod
    async def _read_result(loop: asyncio.AbstractEventLoop, sock: socket.socket):
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

    async def _response(self, res: dict[str, Any], steps, files) -> dict[str, Any]:
        if res.get("input_error"):
            return _error(res["input_error"], status="Failed")
        if res.get("error"):
            return self._failed(res["error"])
        if res.get("setup_error"):
            return _error(f"{res['setup_error']}; the code was not run")
        comp = rr = None
        notes = []
        memory_exceeded = False
        for st, out, err in steps:
            memory_exceeded |= bool(st.get("memory_exceeded"))
            r = CommandResult(status=st["status"], execution_time=st["execution_time"], return_code=st["return_code"],
                              stdout=out.decode("utf-8", "replace"), stderr=err.decode("utf-8", "replace"),
                              cpu_time=st.get("cpu_time"))
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
            return {"status": "Failed", "message": msg, "compile_result": comp.as_dict() if comp else None,
                    "run_result": None, "executor_pod_name": None, "files": enc}
        ok = rr.status == "Finished" and rr.return_code == 0 and not memory_exceeded
        msg = "" if ok or (memory_exceeded and rr.return_code == 0) else _summary(rr)
        if notes:
            msg = "; ".join(notes) if not msg else f"{msg}: {'; '.join(notes)}"
        return {"status": "Success" if ok else "Failed", "message": msg,
                "compile_result": comp.as_dict() if comp else None, "run_result": rr.as_dict(),
                "executor_pod_name": None, "files": enc, "not_fetched": dict(res.get("not_fetched") or [])}


    def _failed(self, why: str) -> dict[str, Any]:
        if self._closed:  # (`stop_runs` killed its slot)
            return _error("the sandbox server stopped this run (its owner is gone, or it is shutting down); "
                          "the code may have run")
        return _error(f"the run failed inside the sandbox: {why}; the code may have run")


def _summary(rr: CommandResult) -> str:
    if rr.status == "TimeLimitExceeded":
        return f"time limit exceeded after {rr.execution_time}s"
    if rr.status == "Error":
        return "the run was stopped"
    return f"process exited with return code {rr.return_code}"


def _error(msg: str, status: str = "SandboxError") -> dict[str, Any]:
    return {"status": status, "message": msg, "compile_result": None, "run_result": None,
            "executor_pod_name": None, "files": {}}


def probe_isolation(cfg: SandboxConfig) -> None:
    """Start one isolated run; raise IsolationUnavailable with the reason if it cannot work."""
    problems = []
    if os.geteuid() != 0:
        problems.append("the sandbox server must run as root to create namespaces and drop to per-run uids")
    if not sys.platform.startswith("linux"):
        problems.append("Linux namespaces are required")
    py = cfg.python or _find_python()
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
            return r.uids.base, await r.run({"language": "python", "run_timeout": 20, "code":
                                "import os\nprint(os.getuid(), os.getpid(), sorted(os.listdir('/sys/class/net')"
                                " if os.path.isdir('/sys/class/net') else []), open('/proc/net/dev').read().count(':'),"
                                " os.path.exists('/etc/shadow'))\nopen('/tmp/probe', 'w').write('x')"})
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
