"""Sessions: a persistent workspace across several commands (E2B-style), in one slot held for its life.

`SessionTable.open` takes a free slot (and an admission place: sessions count against
``--max-concurrency`` like runs, and are refused with 429, never queued), opens the session in it
(`slot_session.py`: the tmpfs budget, the homes, the egress listener), writes the seed files and
unpacks the seed tar. Each `exec` is one program in that slot, run as the slot's uid with the
session's limits and its own deadline; when it ends, every process it started is killed (as for
a run); the workspace (``/tmp``, ``/mnt``, ``/dev/shm``, ``/home/<user>``, ``/workspace``) stays.
File reads and writes are programs too, as the session's uid (never the root init: the workspace is
the program's, and may hold its symlinks). `close` ends the slot: every process, the namespaces, the tmpfs and the egress
go. A session left idle past its ``idle_timeout``, or alive past its ``max_lifetime``, is closed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shlex
import socket
import struct
import time
import uuid
from typing import Any

from slime.sandbox.config import SessionSettings  # noqa: F401 - its import path before it moved to config.py
from slime.sandbox.egress import EgressForwarder
from slime.sandbox.languages import run_env
from slime.sandbox.run_plan import normalize_path
from slime.sandbox.runner import Runner
from slime.sandbox.slot_session import SESSION_DIRS

logger = logging.getLogger(__name__)
WORKDIR = "/tmp"
HOME = "/home/agent"
MARGIN = 30.0  # seconds on top of a frame's own deadlines before its slot is given up


class SessionError(Exception):
    """`status` is the HTTP answer; the message names the session and the field or flag."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


@dataclasses.dataclass(frozen=True)
class SessionSpec:
    memory_mb: int
    disk_mb: int
    max_inodes: int
    idle_timeout: float
    max_lifetime: float
    egress: str | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    files: dict[str, bytes] = dataclasses.field(default_factory=dict)  # seed files (path -> content)
    tar: bytes | None = None  # seed tar, unpacked into the workspace


@dataclasses.dataclass
class ExecOutcome:
    status: str  # Finished | TimeLimitExceeded | Error (SandboxFusion's command statuses)
    returncode: int | None  # None after a timeout
    stdout: str | bytes  # bytes only for a file read (`read_file`)
    stderr: str
    execution_time: float | None
    cpu_time: float | None
    message: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Session:
    def __init__(self, sid: str, slot: int, uid: int, spec: SessionSpec, egress_url: str | None) -> None:
        self.id, self.slot, self.uid, self.spec, self.egress_url = sid, slot, uid, spec, egress_url
        self.forwarder: EgressForwarder | None = None
        self.lock = asyncio.Lock()  # one program at a time: the slot serves one request after another
        self.exchange: asyncio.Task | None = None  # the frame in flight (cancelled first when the session ends)
        self.egress_cap = 0  # egress connections it may hold, reserved against the server's budget
        self.closed = False
        self.execs = 0
        self.created = time.monotonic()
        self.idle_timer: asyncio.TimerHandle | None = None
        self.life_timer: asyncio.TimerHandle | None = None

    def info(self) -> dict[str, Any]:
        return {
            "session_id": self.id,
            "uid": self.uid,
            "workdir": WORKDIR,
            "home": HOME,
            "egress": self.spec.egress,
            "egress_url": self.egress_url,
            "execs": self.execs,
            "memory_mb": self.spec.memory_mb,
            "disk_mb": self.spec.disk_mb,
            "max_inodes": self.spec.max_inodes,
            "idle_timeout": self.spec.idle_timeout,
            "max_lifetime": self.spec.max_lifetime,
            "egress_counters": dataclasses.asdict(self.forwarder.counters) if self.forwarder else None,
        }


class SessionTable:
    """Owns the open sessions of one server; `admission` is the server's `Admission`."""

    def __init__(self, runner: Runner, admission, settings: SessionSettings) -> None:
        self.runner, self.adm, self.settings = runner, admission, settings
        self.sessions: dict[str, Session] = {}
        self._expiring: set[asyncio.Task] = set()  # sessions being closed by a deadline (held: not collected)
        self._opening = 0  # sessions being set up (they count against --max-sessions already)
        self.egress_reserved = 0  # egress connections open sessions may hold (their caps), against `egress_budget`
        self.opened = self.closed_idle = self.closed_lifetime = self.failed = 0

    # -- lifecycle ---------------------------------------------------------------------------
    async def open(self, spec: SessionSpec) -> Session:
        if not self.runner.cfg.isolate:
            raise SessionError(
                501,
                "sessions need the sandbox's isolation (this server runs with "
                "--allow-no-isolation): no session was opened",
            )
        target = None
        if spec.egress is not None:
            target = self.settings.egress_targets.get(spec.egress)
            if target is None:
                known = ", ".join(sorted(self.settings.egress_targets)) or "none (see --egress)"
                raise SessionError(422, f"egress {spec.egress!r} is not configured on this server; configured: {known}")
        cap = self.settings.max_egress_connections if target else 0
        budget = self.settings.egress_budget
        if cap and budget is not None and self.egress_reserved + cap > budget:
            raise SessionError(
                503,
                f"this server cannot serve another session with an egress: its open-file limit "
                f"leaves room for {budget} egress connections, {self.egress_reserved} are held by "
                f"open sessions and this one may open {cap} (--max-egress-connections); raise "
                "the hard limit (ulimit -Hn) or lower --max-connections / --max-egress-connections",
                retry_after=5.0,
            )
        if len(self.sessions) + self._opening >= self.settings.max_sessions:
            raise SessionError(
                429,
                f"{len(self.sessions) + self._opening} sessions are open (--max-sessions {self.settings.max_sessions})",
                retry_after=5.0,
            )
        if not self.adm.hold():
            raise SessionError(
                429,
                f"sandbox busy: every slot is running or queued for (--max-concurrency {self.adm.cap})",
                retry_after=self.adm.retry_after(),
            )
        slot = self.runner.take_slot()
        if slot is None:
            self.adm.release()
            raise SessionError(429, "sandbox busy: no free slot", retry_after=self.adm.retry_after())
        port = self.settings.egress_port if target else 0
        sess = Session(
            uuid.uuid4().hex, slot, self.runner.uids.base + slot, spec, f"http://127.0.0.1:{port}" if target else None
        )
        sess.egress_cap = cap
        self.egress_reserved += cap  # (given back by `_end`)
        self._opening += 1
        try:
            await self._start(sess, target)
        except BaseException:
            await self._end(sess)
            raise
        finally:
            self._opening -= 1
        self.sessions[sess.id] = sess
        self.opened += 1
        loop = asyncio.get_running_loop()
        sess.life_timer = loop.call_later(spec.max_lifetime, self._expire, sess, "max_lifetime")
        self._arm_idle(sess)
        return sess

    async def _start(self, sess: Session, target: tuple[str, int] | None) -> None:
        spec = sess.spec
        files = {inside_path(p): data for p, data in spec.files.items()}
        head = {
            "session": {
                "disk_mb": spec.disk_mb,
                "max_inodes": spec.max_inodes,
                "egress_port": self.settings.egress_port if target else 0,
            }
        }
        res, _ = await self._exchange(sess, self._frame(sess, head, files=files), 0)
        if res.get("input_error") or res.get("setup_error"):
            raise SessionError(422, f"the session could not be set up: {res.get('input_error') or res['setup_error']}")
        if target is not None:
            _msg, fds = await self.runner.receive_fds(sess.slot, MARGIN)
            if len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                raise SessionError(500, f"the slot sent {len(fds)} egress sockets instead of one")
            sess.forwarder = EgressForwarder(
                socket.socket(fileno=fds[0]), target, max_connections=self.settings.max_egress_connections
            )
            await sess.forwarder.start()
        if spec.tar is not None:
            out = await self._program(sess, ["/bin/tar", "-x", "-f", "-", "-C", WORKDIR], 120.0, spec.tar)
            if out.status != "Finished" or out.returncode != 0:
                raise SessionError(
                    422,
                    f"the seed tar could not be unpacked into {WORKDIR}: {out.message or out.stderr.strip()[-500:]}",
                )

    def get(self, sid: str) -> Session:
        sess = self.sessions.get(sid)
        if sess is None:
            raise SessionError(404, f"no open session {sid!r} (closed, expired, or never opened)")
        return sess

    async def close(self, sid: str) -> None:
        sess = self.get(sid)
        await self._end(sess)

    async def close_all(self) -> None:
        await asyncio.gather(
            *(self._end(s) for s in list(self.sessions.values())), *self._expiring, return_exceptions=True
        )

    async def _end(self, sess: Session) -> None:
        """Everything of the session goes: its slot (processes, namespaces, tmpfs), its egress."""
        if sess.closed:
            return
        sess.closed = True
        self.sessions.pop(sess.id, None)
        self.egress_reserved -= sess.egress_cap
        for timer in (sess.idle_timer, sess.life_timer):
            if timer is not None:
                timer.cancel()
        if sess.exchange is not None and sess.exchange is not asyncio.current_task():
            sess.exchange.cancel()  # (its socket reader goes before the slot's socket is closed)
            await asyncio.wait([sess.exchange])
        try:
            if sess.forwarder is not None:
                await sess.forwarder.close()
            await self.runner.end_slot(sess.slot)
        finally:
            self.adm.release()

    def _expire(self, sess: Session, why: str) -> None:
        if sess.closed:
            return
        if why == "idle_timeout":
            self.closed_idle += 1
        else:
            self.closed_lifetime += 1
        logger.info("session %s closed: its %s (%.0fs) passed", sess.id, why, getattr(sess.spec, why))
        task = asyncio.ensure_future(self._end(sess))
        self._expiring.add(task)
        task.add_done_callback(self._expired)

    def _expired(self, task: asyncio.Task) -> None:
        self._expiring.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("closing an expired session failed: %r", task.exception())

    def _arm_idle(self, sess: Session) -> None:
        if sess.idle_timer is not None:
            sess.idle_timer.cancel()
        sess.idle_timer = asyncio.get_running_loop().call_later(
            sess.spec.idle_timeout, self._expire, sess, "idle_timeout"
        )

    # -- commands ----------------------------------------------------------------------------
    async def exec(
        self,
        sid: str,
        command: str,
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = 120.0,
        stdin: bytes | None = None,
    ) -> ExecOutcome:
        sess = self.get(sid)
        script = command if cwd is None else f"cd -- {shlex.quote(cwd)} || exit 1\n{command}"
        return await self._program(sess, ["/bin/bash", "-c", script], timeout, stdin, env)

    async def write_file(self, sid: str, path: str, data: bytes) -> None:
        sess = self.get(sid)
        out = await self._program(
            sess, ["/bin/sh", "-c", 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', "write_file", path], 60.0, data
        )
        if out.status != "Finished" or out.returncode != 0:
            raise SessionError(
                422, f"session {sid}: {path!r} could not be written: {out.message or out.stderr.strip()[-500:]}"
            )

    async def read_file(self, sid: str, path: str) -> bytes:
        sess = self.get(sid)
        out = await self._program(sess, ["/bin/cat", "--", path], 60.0, raw=True)
        if out.message.startswith("output limit exceeded"):
            raise SessionError(
                413,
                f"session {sid}: {path!r} is larger than the {self.runner.cfg.max_output_bytes} "
                "bytes one read returns (--max-output-bytes)",
            )
        if out.status != "Finished" or out.returncode != 0:
            raise SessionError(
                404, f"session {sid}: {path!r} could not be read: {out.message or out.stderr.strip()[-500:]}"
            )
        return out.stdout

    async def _program(
        self,
        sess: Session,
        argv: list[str],
        timeout: float,
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
        raw: bool = False,
    ) -> ExecOutcome:
        """One program in the session's slot, the session's other requests waiting their turn
        within the same deadline."""
        if not 0 < timeout <= self.settings.max_exec_timeout:
            raise SessionError(
                422,
                f"timeout {timeout} must be in (0, {self.settings.max_exec_timeout:g}] (--max-session-exec-timeout)",
            )
        if sess.idle_timer is not None:
            sess.idle_timer.cancel()
        try:
            try:
                await asyncio.wait_for(sess.lock.acquire(), timeout)
            except asyncio.TimeoutError:
                raise SessionError(409, f"session {sess.id}: another command still ran after {timeout:g}s") from None
            try:
                if sess.closed:
                    raise SessionError(404, f"session {sess.id} was closed while this command waited")
                step = {
                    "argv": argv,
                    "warm_python": False,
                    "timeout": timeout,
                    "cpu_s": max(1, int(timeout + 0.999)),
                    "mem_mb": sess.spec.memory_mb,
                    "stdin": stdin is not None,
                    "kind": "run",
                    "rlimit_as": "memory" in self.runner.per_process_only,
                }
                frame = self._frame(sess, {}, steps=[step], stdin=stdin, env=env)
                res, steps = await self._exchange(sess, frame, timeout)
                sess.execs += 1
                return _outcome(res, steps, raw)
            finally:
                sess.lock.release()
        finally:
            if not sess.closed:
                self._arm_idle(sess)

    # -- the slot's protocol -------------------------------------------------------------------
    async def _exchange(self, sess: Session, frame: bytes, timeout: float):
        """A frame to the session's slot and its answer; a slot that fails ends the session."""
        sess.exchange = asyncio.ensure_future(self.runner.exchange(sess.slot, frame, timeout + MARGIN))
        try:
            res, steps, _files = await asyncio.shield(sess.exchange)  # (our caller going must not cut it short)
        except asyncio.CancelledError:
            if sess.closed and sess.exchange.cancelled() and not asyncio.current_task().cancelling():
                raise SessionError(
                    410, f"session {sess.id} was closed while this command ran; its processes were killed"
                ) from None
            if not sess.closed and not sess.exchange.done():
                await self._stop_program(sess)  # (its client went: the command stops, the session stays)
            raise
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError, OSError) as e:
            self.failed += 1
            await self._end(sess)
            raise SessionError(
                500, f"session {sess.id} failed inside the sandbox ({type(e).__name__}: {e}); it is closed"
            ) from None
        finally:
            sess.exchange = None
        if res.get("error"):
            self.failed += 1
            await self._end(sess)
            raise SessionError(500, f"session {sess.id} failed inside the sandbox ({res['error']}); it is closed")
        return res, steps

    async def _stop_program(self, sess: Session) -> None:
        """Stop the session's running command and wait for its answer (dropped), so that the next
        command finds the slot free and in step; a slot that does not answer ends the session."""
        exchange = sess.exchange
        try:
            async with asyncio.timeout(MARGIN):
                await self.runner.stop_program(sess.slot, exchange)
                await asyncio.shield(exchange)
        except (asyncio.TimeoutError, ConnectionError, asyncio.IncompleteReadError, OSError):
            self.failed += 1
            await self._end(sess)
        except asyncio.CancelledError:
            if exchange.cancelled():  # (the session was closed meanwhile: `_end` cancelled it)
                return
            raise

    def _frame(
        self,
        sess: Session,
        extra: dict[str, Any],
        *,
        steps=(),
        files: dict[str, bytes] | None = None,
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
    ) -> bytes:
        cfg = self.runner.cfg
        files = files or {}
        hdr = {
            "uid": sess.uid,
            "workdir": WORKDIR,
            "env": self._env(sess, env),
            "disk_mb": sess.spec.disk_mb,
            "files": [[p, len(d)] for p, d in files.items()],
            "source": None,
            "code_size": 0,
            "stdin_size": len(stdin) if stdin is not None else -1,
            "steps": list(steps),
            "fetch": [],
            "fetch_max_file": 0,
            "fetch_max_total": 0,
            "max_output": cfg.max_output_bytes,
            "max_processes": cfg.max_processes,
            "max_file_mb": cfg.max_file_mb,
            "max_open_files": cfg.max_open_files,
            **extra,
        }
        head = json.dumps(hdr).encode()
        return b"".join([struct.pack("!I", len(head)), head, *files.values(), stdin or b""])

    @staticmethod
    def _env(sess: Session, env: dict[str, str] | None) -> dict[str, str]:
        # git's system-wide config in the session's tmpfs (/etc is read-only): `git config --system` works
        out = dict(run_env(), HOME=HOME, PWD=WORKDIR, GIT_CONFIG_SYSTEM="/home/.gitconfig")
        if sess.egress_url:
            out["SLIME_EGRESS_URL"] = sess.egress_url
        out.update(sess.spec.env)
        out.update(env or {})
        return out


def inside_path(path: str) -> str:
    """A seed file's path as the init writes it: relative to the workspace, or under /mnt (``/home``
    is ``/mnt/home``, ``/workspace`` is ``/mnt/workspace``)."""
    for link, target in SESSION_DIRS.items():
        if path.startswith(link + "/"):
            return normalize_path(target + path[len(link) :])
    return normalize_path(path)


def _outcome(res: dict[str, Any], steps, raw: bool) -> ExecOutcome:
    if res.get("input_error") or res.get("setup_error"):
        return ExecOutcome(
            "Error",
            None,
            b"" if raw else "",
            res.get("input_error") or res["setup_error"],
            None,
            None,
            res.get("input_error") or res["setup_error"],
        )
    st, out, err = steps[0]
    notes = list(st.get("notes") or [])
    if st["status"] == "TimeLimitExceeded" and not notes:
        notes.append(f"time limit exceeded after {st['execution_time']}s")
    return ExecOutcome(
        st["status"],
        st["return_code"],
        bytes(out) if raw else out.decode("utf-8", "replace"),
        err.decode("utf-8", "replace"),
        st["execution_time"],
        st.get("cpu_time"),
        "; ".join(notes),
    )
