"""Local code sandbox, SandboxFusion-compatible (`POST /run_code`, `GET /v1/ping`).

    slime-sandbox --host 127.0.0.1 --port 8080 [--max-concurrency 4] [--max-queue 64]
                  [--allow-no-isolation] [--python /usr/bin/python3] [--default-memory-mb 512]
                  [--disk-mb 256] [--cpus-per-run 1] [--max-body-mb 32] [--max-fetch-mb 64]

Requests are admitted before their body is read, then read within ``--body-timeout`` (``408``),
at most ``--max-bodies`` at once, and validated (`schema.py`, `endpoint.py`): a wrong type, an
unknown language, an out-of-range limit or too many files answers ``422`` naming the field; a body
over ``--max-body-mb`` answers ``413``. Large bodies are parsed, and large answers encoded, off the
event loop. A client that disconnects cancels its run. SIGTERM lets running runs finish; a second
one stops them; the parent's death (``--lifeline-fd``) stops them at once.

At most ``--max-concurrency`` runs execute at once; up to ``--max-queue`` more wait in FIFO order;
beyond that the answer is ``429`` with ``Retry-After`` (seconds) and ``retry_after_s`` in the body.
``GET /v1/stats`` gives running/queued/max-observed/rejected counters (``POST /v1/stats/reset``
resets the observed maximum). Isolation (see runner.py) is probed at start; without it the server
refuses to start unless ``--allow-no-isolation`` is given.

Sessions (``/sessions``: a workspace kept across commands in one slot, at most one egress to a target the
operator names with ``--egress``; tools bound read-only with ``--ro-bind``) are `sessions.py`'s.

`start_local_sandbox()` runs one in a child process for the RolloutManager or the tool
(``sandbox_fusion_url: local``); the listening socket is bound by the parent and handed over, so
the URL is valid (connections queue in the backlog) before the child has even started.
"""

import argparse
import asyncio
import collections
import contextlib
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from typing import Any

logger = logging.getLogger("slime.sandbox")
READY = "SLIME_SANDBOX_READY"


class Admission:
    """FIFO admission: `cap` running, `queue` waiting (including those whose body is still being
    read: a place is reserved before the body is read), the rest refused."""

    def __init__(self, cap: int, queue: int) -> None:
        self.cap, self.queue_cap = cap, queue
        self.running = 0
        self.reading = 0  # reserved: body being read or parsed (or waiting for its turn to be)
        self.bodies = 0  # bodies being read or parsed now (at most --max-bodies: `endpoint.py`)
        self.waiters: collections.deque[asyncio.Future] = collections.deque()
        self.max_running = 0
        self.max_queued = 0
        self.total = 0
        self.rejected = 0
        self.run_time_ewma = 0.05

    def reserve(self) -> bool:
        """A place for a request whose body is not read yet; False: answer 429."""
        if self.running + len(self.waiters) + self.reading >= self.cap + self.queue_cap:
            self.rejected += 1
            return False
        self.reading += 1
        return True

    def unreserve(self) -> None:
        self.reading -= 1

    def try_enter(self) -> asyncio.Future | bool:
        """With a reservation: True (run now) or a future to await (queued)."""
        self.reading -= 1
        if self.running < self.cap and not self.waiters:
            self._start()
            return True
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        self.max_queued = max(self.max_queued, len(self.waiters))
        return fut

    def _start(self) -> None:
        self.running += 1
        self.total += 1
        self.max_running = max(self.max_running, self.running)

    def hold(self) -> bool:
        """A place for a session's whole life (it holds a slot): only if one is free now, never queued."""
        if self.running >= self.cap or self.waiters:
            self.rejected += 1
            return False
        self._start()
        return True

    def leave(self, run_time: float) -> None:
        self.run_time_ewma = 0.9 * self.run_time_ewma + 0.1 * run_time
        self.release()

    def release(self) -> None:
        """A run or a session gives its place back: the first waiter runs."""
        self.running -= 1
        while self.waiters and self.running < self.cap:
            fut = self.waiters.popleft()
            if not fut.done():
                self._start()
                fut.set_result(None)

    def abandon(self, fut: asyncio.Future) -> None:
        """A queued client went away."""
        if fut.done() and not fut.cancelled():
            self.leave(0.0)  # it had been admitted in the meantime
        else:
            with contextlib.suppress(ValueError):
                self.waiters.remove(fut)

    def retry_after(self) -> float:
        return max(0.05, self.run_time_ewma * (len(self.waiters) + self.reading + 1) / self.cap)

    def stats(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "queued": len(self.waiters),
            "reading": self.reading,
            "bodies": self.bodies,
            "max_running": self.max_running,
            "max_queued": self.max_queued,
            "max_concurrency": self.cap,
            "max_queue": self.queue_cap,
            "total": self.total,
            "rejected": self.rejected,
        }


def build_app(
    cfg, max_queue: int, lifeline_fd: int | None = None, body_timeout: float = 30.0, max_bodies: int = 4, sessions=None
):
    import json

    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    from slime.sandbox.endpoint import RunCodeEndpoint
    from slime.sandbox.runner import Runner
    from slime.sandbox.schema import RequestParser
    from slime.sandbox.session_routes import add_session_routes
    from slime.sandbox.sessions import SessionSettings, SessionTable

    runner = Runner(cfg)
    adm = Admission(cfg.max_concurrency, max_queue)
    parse = RequestParser(cfg, runner.languages)
    table = SessionTable(runner, adm, sessions or SessionSettings(max_sessions=cfg.max_concurrency))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if lifeline_fd is not None:
            # The parent holds the write end: EOF means it is gone (even SIGKILLed), so we go too.
            def parent_gone() -> None:
                try:
                    if os.read(lifeline_fd, 1):
                        return
                except OSError:
                    pass
                asyncio.get_running_loop().remove_reader(lifeline_fd)
                logger.warning("parent process gone: stopping the running runs and shutting down")
                runner.stop_runs()  # at once: nobody is left to read their answers
                os.kill(os.getpid(), signal.SIGTERM)

            asyncio.get_running_loop().add_reader(lifeline_fd, parent_gone)
        try:
            await runner.start()
        except Exception:
            runner.close()
            raise
        import gc

        gc.collect()
        gc.freeze()  # (everything loaded so far lives as long as the server: the collector skips it)
        if runner.per_process_only:
            logger.warning(
                "limits enforced per process only (no cgroup for them): %s", ", ".join(runner.per_process_only)
            )
        if cfg.isolate and not runner.seccomp:
            logger.warning("no seccomp filter on this architecture: runs rely on no_new_privs and their uid")
        if os.environ.get("SLIME_SANDBOX_READY_FD"):
            fd = int(os.environ["SLIME_SANDBOX_READY_FD"])
            with contextlib.suppress(OSError):
                os.write(fd, (READY + "\n").encode())
                os.close(fd)
        try:
            yield
        finally:
            await table.close_all()
            runner.close()

    app = FastAPI(title="slime-sandbox", lifespan=lifespan)
    app.state.admission = adm
    app.state.runner = runner
    app.state.sessions = table
    add_session_routes(app, table, max_body=cfg.max_body_mb << 20, body_timeout=body_timeout)

    @app.get("/v1/ping")
    async def ping():
        return PlainTextResponse("pong")

    @app.get("/health")
    async def health():
        return {
            "status": "ok",
            "isolation": cfg.isolate,
            "languages": runner.languages,
            "uids": [runner.uids.base, runner.uids.last],
            "cgroups": runner.cgroups.kind,
            "per_process_only": runner.per_process_only,
            "seccomp": runner.seccomp,
            "sessions": len(table.sessions),
            "max_sessions": table.settings.max_sessions,
            "egress": sorted(table.settings.egress_targets),
            "ro_binds": [inside for _, inside in cfg.ro_binds],
        }

    @app.get("/v1/stats")
    async def stats():
        return {**adm.stats(), "isolation": cfg.isolate}

    @app.post("/v1/stats/reset")
    async def reset():
        adm.max_running = adm.running
        adm.max_queued = len(adm.waiters)
        return adm.stats()

    async def execute(body, ticket) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        """POST /run_code once admitted: (HTTP status, JSON body, extra headers)."""
        if ticket is not True:
            try:
                await ticket
            except asyncio.CancelledError:
                adm.abandon(ticket)
                raise
        t0 = time.monotonic()
        try:
            res = await runner.run(body)
        except Exception as e:  # noqa: BLE001 - never a bare 500 without a reason
            logger.exception("run failed")
            res = {
                "status": "SandboxError",
                "message": f"{type(e).__name__}: {e}; the code may have run",
                "compile_result": None,
                "run_result": None,
                "executor_pod_name": None,
                "files": {},
            }
        finally:
            adm.leave(time.monotonic() - t0)
        big = res.get("files") or len((res.get("run_result") or {}).get("stdout") or "") > 65536
        text = await asyncio.to_thread(json.dumps, res) if big else json.dumps(res)
        return 200, text.encode(), []

    @app.post("/run_code")
    async def run_code_route():  # (documents the endpoint; `RunCodeEndpoint` serves it)
        return PlainTextResponse("served by RunCodeEndpoint", status_code=500)

    return RunCodeEndpoint(
        app,
        admission=adm,
        parse=parse,
        execute=execute,
        max_body=cfg.max_body_mb << 20,
        body_timeout=body_timeout,
        max_bodies=max_bodies,
    )


class SandboxServer:
    """uvicorn's server, but a second SIGTERM (or SIGINT) stops the running runs and ends it
    (the first one lets the runs finish)."""

    @staticmethod
    def make(config, runner):
        import uvicorn

        class _Server(uvicorn.Server):
            def handle_exit(self, sig, frame) -> None:
                second = self.should_exit
                super().handle_exit(sig, frame)  # first: the note below may fail, the stop may not
                if second:
                    self.force_exit = True
                    runner.stop_runs()
                    return
                with contextlib.suppress(OSError):  # (EPIPE: an owner that died took our stderr's reader)
                    os.write(
                        2,
                        (
                            f"slime-sandbox: signal {sig}: finishing {runner.running} running run(s); "
                            "a second signal stops them\n"
                        ).encode(),
                    )

        return _Server(config)


def _parser() -> argparse.ArgumentParser:
    from slime.sandbox.flags import SandboxFlags

    ap = argparse.ArgumentParser("slime-sandbox", description="SandboxFusion-compatible local code sandbox")
    return SandboxFlags.add_arguments(ap)


def main(argv: list[str] | None = None) -> None:
    from slime.sandbox.flags import SandboxFlags

    serve(SandboxFlags.from_args(_parser().parse_args(argv)))


def serve(flags) -> None:
    """Run the server of `flags` (a `SandboxFlags`) until a signal or the parent's death; exit 2 on a flag or
    a host that cannot run it, naming why."""
    from slime.sandbox.runner import IsolationUnavailable, probe_isolation

    from slime.sandbox.open_files import egress_connection_budget, raise_soft_limit
    from slime.sandbox.ro_binds import parse_ro_binds, with_interpreter

    logging.basicConfig(level=flags.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    open_files = raise_soft_limit()
    try:
        if problem := flags.range_problem():
            raise ValueError(problem)
        ro_binds = with_interpreter(parse_ro_binds(flags.ro_bind, flags.ro_path), flags.python)
        sessions = flags.session_settings(
            egress_budget=egress_connection_budget(open_files, flags.max_connections, flags.max_concurrency)
        )
    except ValueError as e:
        print(f"slime-sandbox: refusing to start: {e}", file=sys.stderr)
        sys.exit(2)
    cfg = flags.run_config(ro_binds)
    try:
        probe_isolation(cfg)
    except IsolationUnavailable as e:
        if not flags.allow_no_isolation:
            print(
                f"slime-sandbox: refusing to start: sandbox isolation is unavailable: {e}.\n"
                "Run it as root on Linux with util-linux (unshare, setpriv), or pass --allow-no-isolation "
                "to run untrusted code with rlimits only (unsafe: network, other files and processes "
                "stay reachable).",
                file=sys.stderr,
            )
            sys.exit(2)
        logger.warning("isolation unavailable (%s); running WITHOUT namespaces (--allow-no-isolation)", e)
        cfg.isolate = False
    import uvicorn

    from slime.sandbox.uids import UidRangeBusy

    try:
        app = build_app(
            cfg,
            flags.queue,
            lifeline_fd=flags.lifeline_fd,
            body_timeout=flags.body_timeout,
            max_bodies=flags.bodies,
            sessions=sessions,
        )
    except UidRangeBusy as e:
        print(f"slime-sandbox: refusing to start: {e}", file=sys.stderr)
        sys.exit(2)
    config = uvicorn.Config(
        app,
        host=flags.host,
        port=flags.port,
        log_level=flags.log_level,
        timeout_keep_alive=30,
        access_log=False,
        limit_concurrency=flags.max_connections,
    )
    runner = app.app.state.runner
    server = SandboxServer.make(config, runner)
    try:
        # An inherited listening socket: not uvicorn's `fd=` (it wraps the fd as AF_UNIX, so asyncio
        # never sets TCP_NODELAY and every keep-alive response waits ~40 ms for a delayed ACK).
        server.run(sockets=None if flags.fd is None else [socket.socket(fileno=flags.fd)])
    finally:
        runner.close()  # (also after a forced exit, which skips the app's shutdown)


class LocalSandbox:
    """Handle of a sandbox server child process."""

    def __init__(self, proc: subprocess.Popen, url: str, lifeline: int | None = None) -> None:
        self.proc, self.url = proc, url
        self._lifeline = lifeline  # write end; closing it (or our death) stops the server

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self._lifeline is not None:
            with contextlib.suppress(OSError):
                os.close(self._lifeline)
            self._lifeline = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "LocalSandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_local_sandbox(
    host: str = "127.0.0.1",
    *,
    max_concurrency: int | None = None,
    max_queue: int | None = None,
    allow_no_isolation: bool = False,
    extra_args: list[str] | None = None,
    ready_timeout: float = 60.0,
) -> tuple[str, LocalSandbox]:
    """Start `slime-sandbox` in a child process; return (url, handle). `handle.stop()` ends it.

    Raises RuntimeError with the server's message if it cannot start (e.g. isolation missing).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    r, w = os.pipe()
    life_r, life_w = os.pipe()  # non-inheritable: only the server gets the read end
    # -P: our slime (PYTHONPATH below), never one in the caller's working directory
    args = [
        sys.executable,
        "-P",
        "-m",
        "slime.sandbox.server",
        "--fd",
        str(sock.fileno()),
        "--lifeline-fd",
        str(life_r),
    ]
    if max_concurrency:
        args += ["--max-concurrency", str(max_concurrency)]
    if max_queue is not None:
        args += ["--max-queue", str(max_queue)]
    if allow_no_isolation:
        args.append("--allow-no-isolation")
    args += extra_args or []
    env = dict(os.environ, SLIME_SANDBOX_READY_FD=str(w))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    try:
        proc = subprocess.Popen(
            args,
            pass_fds=(sock.fileno(), w, life_r),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except BaseException:
        os.close(life_w)
        raise
    finally:
        os.close(w)
        os.close(life_r)
        sock.close()
    # wait for the READY line or the child's exit: an event, not a sleep
    sel = selectors.DefaultSelector()
    sel.register(r, selectors.EVENT_READ)
    buf = b""
    deadline = time.monotonic() + ready_timeout
    ok = False
    try:
        while READY.encode() not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise RuntimeError(f"slime-sandbox did not become ready in {ready_timeout}s")
            chunk = os.read(r, 4096)
            if not chunk:  # the child closed the pipe: it exited
                proc.wait()
                err = proc.stderr.read().decode(errors="replace").strip()
                raise RuntimeError(f"slime-sandbox exited with code {proc.returncode}: {err[-2000:]}")
            buf += chunk
        ok = True
    finally:
        sel.close()
        os.close(r)
        if not ok:  # the child is reaped and its stderr pipe closed: nothing of it is left open
            os.close(life_w)
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stderr.close()
    # from now on the child's stderr is only logs: drain it so it never blocks, and close it at EOF
    if proc.stderr is not None:
        import threading

        def drain(f) -> None:
            with f:
                for line in iter(f.readline, b""):
                    logger.info("sandbox: %s", line.decode(errors="replace").rstrip())

        threading.Thread(target=drain, args=(proc.stderr,), daemon=True).start()
    return f"http://{host}:{port}", LocalSandbox(proc, f"http://{host}:{port}", life_w)


if __name__ == "__main__":
    main()
