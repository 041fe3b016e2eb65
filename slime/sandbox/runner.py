"""Run untrusted code: one isolated, limited, killable process tree per request.

Every run gets:
* its own temporary working directory (mode 0700, owned by the run's uid, removed afterwards),
  visible to the code as its cwd *and* as ``/tmp`` (a private mount namespace bind-mounts it
  there; ``/dev/shm``, ``/var/tmp`` and ``/run/lock`` become tiny private tmpfs): the code cannot
  leave files anywhere else, and nothing it writes outlives the run;
* a private network namespace (only a downed loopback: no network at all), a private IPC
  namespace and a private PID namespace whose init is the code: when it exits, or when we kill
  the run, the kernel kills every process it left behind (daemons, fork bombs, setsid escapes);
* an unprivileged uid of its own (``uid_base + slot``: concurrent runs cannot signal or read each
  other, and RLIMIT_NPROC, which the kernel counts per uid, is per run), no supplementary groups,
  ``no_new_privs`` (setuid binaries do nothing);
* rlimits on CPU time, address space, processes, file size, open files; a wall-clock timeout that
  SIGKILLs the whole process group; ``PR_SET_PDEATHSIG`` so nothing survives the server;
* a clean environment (PATH, HOME=/tmp, LANG, no inherited variables, hence no secrets);
* stdout/stderr read while it runs, each capped (the run is killed when it floods), so a full
  pipe can never deadlock it.

The namespace and uid steps need root (or CAP_SYS_ADMIN + CAP_SETUID) and util-linux's
``unshare``/``setpriv``. `probe_isolation` checks them once at start; the server refuses to start
without them unless explicitly told ``--allow-no-isolation`` (then runs are only rlimited).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import dataclasses
import logging
import os
import resource
import shutil
import signal
import stat
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


class IsolationUnavailable(RuntimeError):
    pass


@dataclass
class SandboxConfig:
    max_concurrency: int = 4
    isolate: bool = True  # False only with --allow-no-isolation
    uid_base: int = 61000
    python: str | None = None  # interpreter for `python` (must be executable by the run uid)
    root_dir: str | None = None
    default_memory_mb: int = 512
    max_memory_mb: int = 4096
    max_run_timeout: float = 120.0
    max_compile_timeout: float = 60.0
    max_output_bytes: int = 1 << 20  # per stream
    max_processes: int = 64
    max_file_mb: int = 64
    max_open_files: int = 256
    unshare_bin: str = "/usr/bin/unshare"
    setpriv_bin: str = "/usr/bin/setpriv"


@dataclass
class CommandResult:
    status: str  # Finished | Error | TimeLimitExceeded
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    cpu_time: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class _Run:
    uid: int
    workdir: str
    env: dict[str, str] = field(default_factory=dict)


def _errcheck(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _find_python() -> str | None:
    for p in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if os.path.exists(p):
            return os.path.realpath(p)
    return None


LANGUAGES = {
    # language -> (source file name, compile argv or None, run argv); "{py}" is the interpreter
    "python": ("main.py", None, ["{py}", "-I", "main.py"]),
    "python3": ("main.py", None, ["{py}", "-I", "main.py"]),
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


class Runner:
    """Owns the uid slots and the root of the work dirs; `run()` is one request."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        cfg.python = cfg.python or _find_python()
        self.root = tempfile.mkdtemp(prefix="slime-sandbox-", dir=cfg.root_dir)
        os.chmod(self.root, 0o711)  # traversable, not listable
        self._slots: asyncio.Queue[int] | None = None
        self.languages = available_languages(cfg)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _slots_q(self) -> asyncio.Queue[int]:
        if self._slots is None:
            self._slots = asyncio.Queue()
            for i in range(self.cfg.max_concurrency):
                self._slots.put_nowait(self.cfg.uid_base + i)
        return self._slots

    # -- the child side (runs between fork and exec: syscalls only) -------------------------
    def _preexec(self, run: _Run, cpu_s: int, mem_bytes: int):
        cfg = self.cfg
        workdir = run.workdir.encode()
        isolate = cfg.isolate

        def pre() -> None:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if isolate:
                _errcheck(_libc.unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC), "unshare(net,mount,ipc)")
                _errcheck(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
                _errcheck(_libc.mount(workdir, b"/tmp", None, MS_BIND, None), "bind work dir on /tmp")
                for d in (b"/dev/shm", b"/var/tmp", b"/run/lock"):
                    if os.path.isdir(d):
                        _errcheck(_libc.mount(b"tmpfs", d, b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=0755"),
                                  f"tmpfs on {d.decode()}")
                os.chdir("/tmp")
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
            if mem_bytes > 0:
                resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
            resource.setrlimit(resource.RLIMIT_NPROC, (cfg.max_processes, cfg.max_processes))
            fs = cfg.max_file_mb << 20
            resource.setrlimit(resource.RLIMIT_FSIZE, (fs, fs))
            resource.setrlimit(resource.RLIMIT_NOFILE, (cfg.max_open_files, cfg.max_open_files))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.umask(0o077)
            if not isolate:  # isolated runs drop privileges in setpriv, after the pid namespace
                if os.geteuid() == 0:
                    os.setgroups([])
                    os.setgid(run.uid)
                    os.setuid(run.uid)
                _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)

        return pre

    def _wrap(self, argv: list[str], uid: int) -> list[str]:
        """Isolated: unshare (pid ns; its init is the code) -> setpriv (drop to uid) -> argv."""
        if not self.cfg.isolate:
            return argv
        return [self.cfg.unshare_bin, "--pid", "--fork", "--kill-child", "--mount-proc", "--",
                self.cfg.setpriv_bin, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
                "--", *argv]

    # -- one command ---------------------------------------------------------------------
    async def _command(self, run: _Run, argv: list[str], timeout: float, mem_mb: int, stdin: str | None
                       ) -> CommandResult:
        cfg = self.cfg
        cpu_s = max(1, int(timeout + 0.999))
        t0 = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._wrap(argv, run.uid), cwd=run.workdir, env=run.env,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                preexec_fn=self._preexec(run, cpu_s, mem_mb << 20), start_new_session=True)
        except Exception as e:  # noqa: BLE001 - reported to the caller as a sandbox error
            raise SandboxInternalError(f"could not start the process: {type(e).__name__}: {e}") from e
        flooded: list[str] = []

        def kill() -> None:
            # Isolated: kill the pid namespace's init (unshare's child). The kernel then kills
            # every process in the namespace and the init exits only once they are all gone;
            # unshare reaps it and exits, so proc.wait() returning means the run is really over.
            if cfg.isolate:
                try:
                    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
                        kids = [int(x) for x in f.read().split()]
                except (OSError, ValueError):
                    kids = []
                for k in kids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(k, signal.SIGKILL)
                if kids:
                    return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        async def read(stream: asyncio.StreamReader, name: str) -> bytes:
            buf = bytearray()
            while True:
                chunk = await stream.read(65536)
                if not chunk:
                    return bytes(buf)
                room = cfg.max_output_bytes - len(buf)
                buf += chunk[:max(0, room)]
                if len(chunk) > room:
                    flooded.append(name)
                    kill()
                    return bytes(buf)

        async def feed() -> None:
            try:
                proc.stdin.write(stdin.encode())
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                try:
                    proc.stdin.close()
                except Exception:  # noqa: BLE001
                    pass

        readers = [asyncio.ensure_future(read(proc.stdout, "stdout")),
                   asyncio.ensure_future(read(proc.stderr, "stderr"))]
        feeder = asyncio.ensure_future(feed()) if stdin is not None else None
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            timed_out = True
        finally:
            if proc.returncode is None:
                kill()
                await proc.wait()
            if not cfg.isolate:  # without a pid namespace, stragglers of the group (a pgid is
                # never reused while a member lives, so this cannot hit a stranger's group)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        elapsed = time.monotonic() - t0
        # every writer is dead now, so the pipes reach EOF promptly
        done, pending = await asyncio.wait(readers, timeout=5)
        for p in pending:
            p.cancel()
        if feeder is not None:
            feeder.cancel()
        out = readers[0].result() if readers[0] in done else b""
        err = readers[1].result() if readers[1] in done else b""
        rc = proc.returncode
        if self.cfg.isolate and rc is not None and rc > 128 and rc - 128 < 65:
            rc = -(rc - 128)  # unshare --fork reports a killed child as 128+signal
        errs = err.decode("utf-8", "replace")
        if flooded:
            errs += (f"\n[sandbox] output limit exceeded on {', '.join(sorted(set(flooded)))} "
                     f"({cfg.max_output_bytes} bytes): the run was killed")
        elif rc == -signal.SIGXCPU or rc == -signal.SIGKILL and not timed_out and elapsed >= cpu_s:
            errs += f"\n[sandbox] CPU time limit exceeded ({cpu_s}s)"
        elif rc == -signal.SIGXFSZ:
            errs += f"\n[sandbox] file size limit exceeded ({cfg.max_file_mb} MB)"
        status = "TimeLimitExceeded" if timed_out else ("Error" if flooded else "Finished")
        return CommandResult(status=status, execution_time=round(elapsed, 4), return_code=None if timed_out else rc,
                             stdout=out.decode("utf-8", "replace"), stderr=errs)

    # -- one request ---------------------------------------------------------------------
    async def run(self, req: dict[str, Any]) -> dict[str, Any]:
        cfg = self.cfg
        lang = str(req.get("language") or "python").lower()
        if lang not in LANGUAGES or lang not in self.languages:
            return _error(f"language {lang!r} is not supported here; supported: {', '.join(self.languages)}")
        src_name, comp_argv, run_argv = LANGUAGES[lang]
        run_timeout = min(float(req.get("run_timeout") or 10), cfg.max_run_timeout)
        compile_timeout = min(float(req.get("compile_timeout") or 10), cfg.max_compile_timeout)
        mem = req.get("memory_limit_MB")
        mem_mb = cfg.default_memory_mb if mem is None or int(mem) <= 0 else min(int(mem), cfg.max_memory_mb)
        slots = self._slots_q()
        uid = await slots.get()
        workdir = tempfile.mkdtemp(prefix="run-", dir=self.root)
        try:
            os.chown(workdir, uid, uid)
            os.chmod(workdir, 0o700)
            run = _Run(uid, workdir, env=_run_env(workdir if not cfg.isolate else "/tmp"))
            try:
                for path, b64 in (req.get("files") or {}).items():
                    _write_file(workdir, path, base64.b64decode(b64 or ""), uid)
                _write_file(workdir, src_name, str(req.get("code") or "").encode(), uid)
            except (ValueError, OSError) as e:
                return _error(f"bad input file: {e}", status="Failed")
            compile_result = None
            if comp_argv:
                compile_result = await self._command(run, comp_argv, compile_timeout, max(mem_mb, 1024), None)
                if compile_result.status != "Finished" or compile_result.return_code != 0:
                    return {"status": "Failed", "message": "compilation failed",
                            "compile_result": compile_result.as_dict(), "run_result": None,
                            "executor_pod_name": None, "files": {}}
            argv = [a.replace("{py}", cfg.python or "python3") for a in run_argv]
            rr = await self._command(run, argv, run_timeout, mem_mb, req.get("stdin"))
            files = {}
            for path in req.get("fetch_files") or []:
                data = _read_file(workdir, str(path))
                if data is not None:
                    files[str(path)] = base64.b64encode(data).decode()
            ok = rr.status == "Finished" and rr.return_code == 0
            return {"status": "Success" if ok else "Failed", "message": "" if ok else _summary(rr),
                    "compile_result": compile_result.as_dict() if compile_result else None,
                    "run_result": rr.as_dict(), "executor_pod_name": None, "files": files}
        except SandboxInternalError as e:
            return _error(str(e))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            slots.put_nowait(uid)


class SandboxInternalError(RuntimeError):
    pass


def _summary(rr: CommandResult) -> str:
    if rr.status == "TimeLimitExceeded":
        return f"time limit exceeded after {rr.execution_time}s"
    if rr.status == "Error":
        return "output limit exceeded"
    return f"process exited with return code {rr.return_code}"


def _error(msg: str, status: str = "SandboxError") -> dict[str, Any]:
    return {"status": status, "message": msg, "compile_result": None, "run_result": None,
            "executor_pod_name": None, "files": {}}


def _run_env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _safe_path(workdir: str, path: str) -> str:
    """Map a request path (relative, or under /tmp which is the work dir) into the work dir."""
    if not path or "\x00" in path:
        raise ValueError(f"invalid path {path!r}")
    rel = path[len("/tmp/"):] if path.startswith("/tmp/") else path
    if os.path.isabs(rel):
        raise ValueError(f"absolute path outside the work dir: {path!r}")
    full = os.path.normpath(os.path.join(workdir, rel))
    if not full.startswith(workdir + os.sep):
        raise ValueError(f"path escapes the work dir: {path!r}")
    return full


def _write_file(workdir: str, path: str, data: bytes, uid: int) -> None:
    full = _safe_path(workdir, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    d = os.path.dirname(full)
    while d.startswith(workdir + os.sep):
        os.chown(d, uid, uid)
        d = os.path.dirname(d)
    fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
        os.fchown(fd, uid, uid)
    finally:
        os.close(fd)


def _read_file(workdir: str, path: str) -> bytes | None:
    """Read a file the code produced, never following a link out of the work dir."""
    try:
        full = _safe_path(workdir, path)
    except ValueError:
        return None
    real = os.path.realpath(full)
    if not real.startswith(workdir + os.sep):
        return None
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 64 << 20:
            return None
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def probe_isolation(cfg: SandboxConfig) -> None:
    """Run one isolated no-op; raise IsolationUnavailable with the reason if it cannot work."""
    import subprocess

    problems = []
    if os.geteuid() != 0:
        problems.append("the sandbox server must run as root to create namespaces and drop to per-run uids")
    for b in (cfg.unshare_bin, cfg.setpriv_bin):
        if not os.access(b, os.X_OK):
            problems.append(f"{b} (util-linux) is missing")
    if problems:
        raise IsolationUnavailable("; ".join(problems))
    r = Runner(dataclasses.replace(cfg, max_concurrency=1))
    try:
        wd = tempfile.mkdtemp(prefix="probe-", dir=r.root)
        os.chown(wd, cfg.uid_base, cfg.uid_base)
        run = _Run(cfg.uid_base, wd, _run_env("/tmp"))
        script = ("id -u; cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' | tr '\\n' ,; echo; "
                  "echo $$; touch /tmp/probe && echo ok")
        try:
            p = subprocess.run(r._wrap(["/bin/sh", "-c", script], cfg.uid_base), cwd=wd, env=run.env,
                               capture_output=True, text=True, timeout=20,
                               preexec_fn=r._preexec(run, 5, 256 << 20), start_new_session=True)
        except (subprocess.SubprocessError, OSError) as e:
            raise IsolationUnavailable(f"namespaces/uid switch failed: {e}") from e
        lines = p.stdout.split("\n")
        if p.returncode != 0 or len(lines) < 4:
            raise IsolationUnavailable(f"isolated probe failed (rc={p.returncode}): {p.stderr.strip()[:500]}")
        if lines[0].strip() != str(cfg.uid_base):
            raise IsolationUnavailable(f"uid switch did not happen (got uid {lines[0]!r})")
        if lines[1].strip(",") not in ("lo", ""):
            raise IsolationUnavailable(f"network namespace still sees interfaces {lines[1]!r}")
        if lines[2].strip() != "1":
            raise IsolationUnavailable(f"pid namespace missing (pid {lines[2]!r})")
        if lines[3].strip() != "ok" or not os.path.exists(os.path.join(wd, "probe")):
            raise IsolationUnavailable("private /tmp bind mount did not work")
    finally:
        r.close()
