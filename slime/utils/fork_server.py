"""A per-node fork server: heavy imports and state loaded once, children forked from it warm.

Why: on a small machine an engine's start is mostly `import torch, transformers, fastapi` and the
model load, paid again by every engine. The fork server pays it once (started early, while Ray
comes up), then forks a child per request; children share the loaded weights copy-on-write until
one of them changes its own copy (a weight update), so N engines of one model cost one load.

The server runs one fixed entry point (`--main`, given when it is started; a request only brings
argv, environment and log file), so a client cannot make it run arbitrary code. Its socket lives in
a private (0700) directory.

Protocol: one Unix-socket connection per child. The client sends one JSON line
`{"argv", "env", "log_path", "title"}` (title: what `ps` shows for the child); the server answers
`{"pid": N}` (or `{"error": ...}`), and later
`{"exit": code}` (code as `Popen.returncode`: negative for a signal) when the child is gone. The
connection is the child's lifeline: when the client closes it (or dies), the server SIGKILLs the
child's process group. Each child has its own session and a fresh interpreter's signal handlers
(`FRESH_PYTHON_SIGNALS`), and dies with the server (`PR_SET_PDEATHSIG`), which itself dies with
whoever started it. The server stays single-threaded (a fork copies only the calling thread), and
learns about exits from SIGCHLD through its wakeup fd: nothing is polled. The preload runs without
garbage collection and its heap is frozen before any fork (`slime.utils.gc_freeze.collection_paused`):
no collection walks it, in the server or in a child.

Client side, `spawn()` returns a `ForkedProcess` with the parts of `subprocess.Popen` that
`ChildProcess` uses (pid, poll, wait, returncode), so supervision is the same for both.

    python -m slime.utils.fork_server --socket PATH --main mod:fn [--preload mod:fn --preload-json ARGS]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Callable

from slime.utils.child_process import die_with_parent
from slime.utils.gc_freeze import collection_paused
from slime.utils.startup_trace import mark


# A child's signal handlers: those a fresh interpreter starts with (the child runs Python, it does not exec), not
# the server's own SIGCHLD. SIGPIPE (and SIGXFSZ) stay ignored as in any Python process: a write to a peer that
# died then raises EPIPE instead of killing the child with no trace (gloo writes to its peers' sockets without
# MSG_NOSIGNAL, so at SIG_DFL an engine in a weight-update group died silently when a member of the group died).
FRESH_PYTHON_SIGNALS = (
    (signal.SIGCHLD, signal.SIG_DFL),
    (signal.SIGTERM, signal.SIG_DFL),
    (signal.SIGINT, signal.default_int_handler),
    (signal.SIGPIPE, signal.SIG_IGN),
    (signal.SIGXFSZ, signal.SIG_IGN),
)


class ForkServerError(RuntimeError):
    """The fork server could not be reached or refused to start a child."""


def _resolve(spec: str) -> Callable[..., Any]:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _send(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass  # the client is gone; its child is killed when we see the EOF


# ---------------------------------------------------------------------------- server side
class _Server:
    def __init__(self, sock: socket.socket, main: Callable[[list[str], Any], Any], state: Any):
        self.sock, self.main, self.state = sock, main, state
        self.sel = selectors.DefaultSelector()
        self.server_pid = os.getpid()
        self.by_conn: dict[socket.socket, int | None] = {}  # connection -> its child's pid (None: no child yet)
        self.buffers: dict[socket.socket, bytes] = {}
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler is needed for the wakeup fd to fire
        self.sel.register(sock, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "sigchld")

    def serve_forever(self) -> None:
        while True:
            for key, _ in self.sel.select():
                if key.data == "accept":
                    conn, _ = self.sock.accept()
                    self.by_conn[conn] = None
                    self.buffers[conn] = b""
                    self.sel.register(conn, selectors.EVENT_READ, "client")
                elif key.data == "sigchld":
                    try:
                        os.read(self.wake_r, 4096)
                    except BlockingIOError:
                        pass
                    self._reap()
                else:
                    self._on_client(key.fileobj)

    def _on_client(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        pid = self.by_conn.get(conn)
        if not data:  # the client closed its end: its child goes too
            if pid is not None:
                for kill in (os.killpg, os.kill):  # the group; the child itself if it has no group yet
                    try:
                        kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            self._drop(conn)
            return
        if pid is not None:
            return  # one request per connection; anything after it is ignored
        self.buffers[conn] += data
        if b"\n" not in self.buffers[conn]:
            return
        line = self.buffers[conn].split(b"\n", 1)[0]
        try:
            request = json.loads(line)
            argv, env, log_path = list(request["argv"]), dict(request["env"]), str(request["log_path"])
            title = str(request.get("title") or "")
        except (ValueError, KeyError, TypeError) as e:
            _send(conn, {"error": f"bad request: {e}"})
            self._drop(conn)
            return
        try:
            log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as e:
            _send(conn, {"error": f"cannot open log {log_path}: {e}"})
            self._drop(conn)
            return
        settled_r, settled_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(settled_r)
            self._child(argv, env, log_fd, settled_w, title)  # never returns
        os.close(log_fd)
        os.close(settled_w)
        os.read(settled_r, 1)  # the child has its own session (EOF if it died first): killpg(pid) now reaches it
        os.close(settled_r)
        self.by_conn[conn] = pid
        _send(conn, {"pid": pid})

    def _child(self, argv: list[str], env: dict[str, str], log_fd: int, settled_fd: int, title: str) -> None:
        code = 1
        try:
            os.setsid()
            os.close(settled_fd)  # tells the server
            if title:
                _set_title(title)
            die_with_parent()
            if os.getppid() != self.server_pid:  # the server died before the line above took effect
                os._exit(1)
            signal.set_wakeup_fd(-1)
            for sig, handler in FRESH_PYTHON_SIGNALS:
                signal.signal(sig, handler)
            self.sel.close()
            for fd in (self.sock.fileno(), self.wake_r, self.wake_w, *(c.fileno() for c in self.by_conn)):
                try:
                    os.close(fd)
                except OSError:
                    pass
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.close(devnull)
            os.close(log_fd)
            sys.stdout = open(1, "w", buffering=1, closefd=False)
            sys.stderr = open(2, "w", buffering=1, closefd=False)
            os.environ.clear()
            os.environ.update(env)
            random.seed()  # as a fresh interpreter would be, not the server's sequence
            sys.argv = [sys.argv[0], *argv]
            self.main(argv, self.state)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 - report it in the child's log, never return into the server loop
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            for conn, child in list(self.by_conn.items()):
                if child == pid:
                    _send(conn, {"exit": code})
                    self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        self.by_conn.pop(conn, None)
        self.buffers.pop(conn, None)
        conn.close()


def _set_title(title: str) -> None:
    """What `ps` (and /proc/PID/cmdline) show for the child: the command it stands for, not ours."""
    try:
        import setproctitle  # a dependency of Ray's

        setproctitle.setproctitle(title)
    except ImportError:
        pass


def serve(socket_path: str, main: str, preload: str | None = None, preload_args: list | None = None) -> None:
    """Bind first (clients may connect and wait while the preload runs), preload, then serve."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = f"{socket_path}.{os.getpid()}"
    sock.bind(staging)
    sock.listen(64)
    os.rename(staging, socket_path)  # the path appears only once connecting to it works
    state = None
    mark("fork server: listening")
    if preload:
        try:
            t0 = time.monotonic()
            with collection_paused():  # what the preload builds lives on: ~20% of its CPU went to collections
                state = _resolve(preload)(*(preload_args or []))
            mark("fork server: preloaded")
            print(f"fork server: preloaded in {time.monotonic() - t0:.2f}s", flush=True)
        except Exception:  # noqa: BLE001 - children then start cold, and report their own errors
            print(f"fork server: preload {preload} failed; children will load for themselves", file=sys.stderr)
            traceback.print_exc()
    print(f"fork server: serving {main} on {socket_path} (threads: {threading.active_count()})", flush=True)
    _Server(sock, _resolve(main), state).serve_forever()


# ---------------------------------------------------------------------------- client side
class ForkedProcess:
    """A child of the fork server, seen like a `subprocess.Popen`. A reader thread blocks on the
    connection and records the exit code the server sends (an event, not a poll)."""

    def __init__(self, conn: socket.socket, pid: int, rest: bytes = b""):
        self.pid, self.returncode = pid, None
        self._conn, self._rest = conn, rest
        self._exited = threading.Event()
        threading.Thread(target=self._read_exit, name=f"forked-{pid}-exit", daemon=True).start()

    def _read_exit(self) -> None:
        buf = self._rest
        try:
            while b"\n" not in buf:
                chunk = self._conn.recv(4096)
                if not chunk:
                    break
                buf += chunk
        except OSError:
            pass
        try:
            code = json.loads(buf.split(b"\n", 1)[0])["exit"]
        except (ValueError, KeyError, TypeError):
            code = -signal.SIGKILL  # the server died, and its children with it (PR_SET_PDEATHSIG)
        self._conn.close()
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"forked pid {self.pid}", timeout)
        return self.returncode

    def close(self) -> None:
        """Drop the lifeline: the server kills the child if it still runs."""
        try:
            self._conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def spawn(
    socket_path: str, argv: list[str], env: dict[str, str], log_path: str, timeout: float, title: str = ""
) -> ForkedProcess:
    """Ask the fork server for a child; `timeout` also covers a server still preloading. `title`:
    the child's command line as `ps` shows it (e.g. the command it replaces)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(socket_path)
        request = {"argv": argv, "env": env, "log_path": log_path, "title": title}
        conn.sendall((json.dumps(request) + "\n").encode())
        buf = b""
        while b"\n" not in buf:
            chunk = conn.recv(4096)
            if not chunk:
                raise ForkServerError(f"fork server {socket_path} closed the connection")
            buf += chunk
    except OSError as e:
        conn.close()
        raise ForkServerError(f"fork server {socket_path}: {e}") from None
    line, _, rest = buf.partition(b"\n")
    answer = json.loads(line)
    if "pid" not in answer:
        conn.close()
        raise ForkServerError(f"fork server {socket_path}: {answer.get('error', answer)}")
    conn.settimeout(None)
    return ForkedProcess(conn, int(answer["pid"]), rest)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--main", required=True, help="mod:fn called in each child as fn(argv, preloaded_state)")
    ap.add_argument("--preload", default=None, help="mod:fn called once; its result is every child's state")
    ap.add_argument("--preload-json", default="[]", help="JSON list of arguments for --preload")
    a = ap.parse_args(argv)
    serve(a.socket, a.main, a.preload, json.loads(a.preload_json))


if __name__ == "__main__":
    main()
