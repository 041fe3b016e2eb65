"""PID 1 of a slot's PID namespace: serves the slot's runs one after the other (stdlib only).

Why a separate init: the program must be an ordinary process (self-signals and ``abort()`` behave
as outside), and someone must reap its orphans, enforce the wall-clock timeout and the output limit,
and kill every process of the run when it ends. This init does that, as root, never changing
credentials (so its ``PR_SET_PDEATHSIG`` tied to the fork server holds).

It never forks a program itself: the fork server does, on its request (`zygote.py`). Forking from
an idle process keeps this one's memory unshared, so the init does not pay copy-on-write faults
for its own work after every fork.

Per run: fresh mount and IPC namespaces with one size-limited tmpfs as ``/tmp`` (the cwd), ``/mnt``
and ``/dev/shm``, made ready *before* the request arrives (right after the previous run); the request's
files written into it; each step (compile, run) forked by the fork server into those namespaces;
output read (capped), timeout enforced; then every process of the namespace killed and reaped,
requested files read, the result sent, and the namespaces left (the tmpfs goes with them).

Protocol with the server: the control socket (SOCK_SEQPACKET) carries the ready report; the slot's
request stream (SOCK_STREAM, one for the slot's life: no socket made and passed per run) carries
each request and then its answer, ``<u32 length><JSON header><blobs>`` both ways; its EOF (the server
gone, or ending the slot after a timeout or a cancel) kills a run still going and ends the init,
and with it the slot. With the fork server:
``{"seq": n, "step": ...}`` plus the program's stdin, stdout and stderr fds and the run's namespaces; it
answers ``{"exit": wait status, "cpu": seconds}`` when it has reaped the program (and, without
isolation, ``{"pid": n}`` at the fork: the process group to kill).
"""

import errno
import json
import os
import select
import signal
import socket
import struct
import time

from .isolation import (
    CLONE_NEWIPC,
    CLONE_NEWNS,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    check,
    hold_run_binds,
    libc,
    mount,
    nest_run_binds,
)
from .ns_dropper import NamespaceDropper
from .run_files import fetch_files, write_file
from .run_frames import STOP, Request, send_frame
from .run_memory import LimitNotApplied, RunMemory
from .slot_session import open_session

FORK_MSG_MAX = 60000  # a request to the fork server in one message (it reads 64 KiB at most)

__all__ = ["LimitNotApplied", "RunInit", "cpu_limit_killed", "send_frame"]  # (LimitNotApplied: for its importers)


def cpu_limit_killed(rc, cpu, cpu_s):
    """Whether the program died of its CPU limit (``RLIMIT_CPU``: SIGXCPU at `cpu_s` seconds, SIGKILL
    one second later if it survived that). Decided by the signal's cause, not the time measured:
    the kernel compares the limit with its tick-sampled clock, while the time we are told (rusage)
    is the precise one, which lags it by up to a tenth of a second with a few spinning threads. So a
    SIGXCPU is the limit's unless the program had used less than `cpu_s` - 1 s (then it sent the
    signal itself, as a plain ``python3`` would show); a SIGKILL is the limit's only past `cpu_s`
    (anything else that kills, timeout, memory, output, is decided before this)."""
    if cpu is None:
        return False
    if rc == -signal.SIGXCPU:
        return cpu >= cpu_s - 1
    return rc == -signal.SIGKILL and cpu >= cpu_s


class RunInit(RunMemory):
    """The slot's init. `slot` is the fork server's state (inherited by fork): isolation flag, uid,
    cgroup fds; `ctl` reports to the server, `data` carries its requests and our answers, `forker`
    talks to the fork server."""

    def __init__(self, slot, ctl, forker, data=None):
        self.slot, self.ctl, self.forker, self.data = slot, ctl, forker, data
        self.isolate = slot.isolate
        self.base_ns = []
        self.run_ns = []  # the run's IPC and mount namespaces (fds), while ready
        self.drop_queue = None  # namespaces of finished runs, for the thread that drops them
        self.mem_limit = None
        self.child = None  # the program's pid as the fork server sees it (only without isolation)
        self.wstatus = self.cpu = None
        self.seq = 0  # numbers the fork requests: an answer names the step it is about
        self.killing = False
        self.sock_fd = -1
        self.ready = False  # the next run's namespaces and tmpfs are in place
        self.wake_r = self.poller = None
        self.keep = False  # a session's slot: its namespaces and tmpfs stay from one request to the next
        self.egress_hold = None  # a session's [::1]:<egress port>, held for its life (`slot_session.py`)

    def serve(self):
        if os.geteuid() == 0:
            os.setgroups([])  # (root's groups would grant group access to what it opens as the run: `run_files`)
        if self.isolate:
            # /proc of this namespace; hidepid: a run sees its own processes, never this init (root)
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
            self.base_ns = [
                (os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC), CLONE_NEWNS),
                (os.open("/proc/self/ns/ipc", os.O_RDONLY | os.O_CLOEXEC), CLONE_NEWIPC),
            ]
        # SIGCHLD (orphans to reap) wakes the select loop; signals sent to the init go to the run
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *a: None)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, self._forward)
        self.poller = select.epoll()
        self.poller.register(self.wake_r, select.EPOLLIN)
        self.poller.register(self.forker.fileno(), select.EPOLLIN)
        with open("/proc/self/statm") as f:  # = the fork server's, of which we are a copy
            vm_bytes = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") + (8 << 20)
        self.forker.send(json.dumps({"vm_bytes": vm_bytes}).encode())
        self._make_ready()
        self.ctl.sendmsg(
            [
                json.dumps(
                    {"ready": True, "base_bytes": self.slot.base_bytes, "seccomp": self.slot.seccomp is not None}
                ).encode()
            ]
        )
        sock = self.data
        while True:
            try:
                first = sock.recv(1 << 16)
            except OSError:
                first = b""
            if not first:
                os._exit(0)  # the server is gone (or ended the slot): so is this namespace, and with it any run
            first = first.lstrip(STOP)  # (a stop that came after its program had ended: nothing to stop)
            if not first:
                continue
            try:
                self._run(sock, first)
            finally:
                if not self.keep:
                    self._leave()
                    self._make_ready()  # while idle: the next request finds its tmpfs mounted

    def _forward(self, signum, _frame):
        try:
            if self.isolate:
                os.kill(-1, signum)  # every process of the run (never this init)
            elif self.child:
                os.killpg(self.child, signum)
        except (ProcessLookupError, PermissionError):
            pass

    # -- the run's namespaces and tmpfs ------------------------------------------------------
    def _make_ready(self):
        """Fresh mount and IPC namespaces with the run's tmpfs as /tmp and /dev/shm."""
        if not self.isolate or self.ready:
            return
        slot = self.slot
        check(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare(mnt,ipc)")
        held = hold_run_binds(slot.cfg)  # (--ro-bind below /tmp, /mnt, /home, /workspace: `isolation.py`)
        size = "size=%dk,nr_inodes=%d,mode=0755" % (slot.disk_mb << 10, slot.max_inodes)
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, size)
        for d in ("t", "s", "m"):
            os.mkdir("/dev/shm/" + d, 0o1777 if d == "s" else 0o755)
            os.chown("/dev/shm/" + d, slot.uid, slot.uid)
        mount("/dev/shm/t", "/tmp", None, MS_BIND)
        mount("/dev/shm/m", "/mnt", None, MS_BIND)  # (SandboxFusion's programs write /mnt too)
        nest_run_binds(held, slot.uid)
        mount("/dev/shm/s", "/dev/shm", None, MS_BIND)
        # handed to the fork server with each step: it forks the program inside them
        self.run_ns = [
            os.open("/proc/self/ns/ipc", os.O_RDONLY | os.O_CLOEXEC),
            os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC),
        ]
        self.ready = True

    def _leave(self):
        """Back to the slot's namespaces; the run's go (and its tmpfs with them) in the background.

        Tearing down a mount namespace waits for an RCU grace period (milliseconds, far longer on
        a busy host) in whichever task drops the last reference. Our fds keep the run's namespaces
        alive while we leave them (so leaving is instant); a thread closes them, and waits."""
        if self.isolate and self.ready:
            for fd, kind in self.base_ns:
                check(libc.setns(fd, kind), "setns back")
            self._dropper().put(self.run_ns)
            self.run_ns = []
        self.ready = False

    def _dropper(self):
        if self.drop_queue is None:
            self.drop_queue = NamespaceDropper()
        return self.drop_queue

    # -- one run -----------------------------------------------------------------------------
    def _run(self, sock, first):
        try:
            self._serve_run(sock, first)
        except Exception as e:  # noqa: BLE001 - reported to the server, never to the program's streams
            try:
                self._kill_all()
                send_frame(sock, {"error": "%s: %s" % (type(e).__name__, e), "steps": [], "files": []})
            except Exception:  # noqa: BLE001
                pass
            os._exit(1)  # in an unknown state: the slot ends here (the server starts a fresh one)

    def _serve_run(self, sock, first):
        self.sock_fd = sock.fileno()
        self._reap(block=False)  # zombies of the previous run that died after it was reported
        req = Request(sock, first)
        (n,) = struct.unpack("!I", req.take(4))
        hdr = json.loads(req.take(n))
        blobs = []
        for _path, size in hdr["files"]:
            blobs.append(req.take(size))
        code_blob = req.take(hdr["code_size"])
        stdin = req.take(hdr["stdin_size"]) if hdr["stdin_size"] >= 0 else None
        del req
        result = {"steps": [], "files": []}
        out_blobs = []
        try:
            self._make_ready()
            work = "/tmp" if self.isolate else hdr["workdir"]
            if hdr.get("session"):  # (`slot_session.py`)
                self.keep = True
                open_session(self, hdr["session"])
            if hdr["source"]:
                write_file(work, hdr["source"], code_blob, hdr["uid"])
            for (path, _), data in zip(hdr["files"], blobs):
                if path.startswith("/mnt/"):
                    if not self.isolate:
                        raise OSError(errno.EINVAL, "/mnt is only per run with isolation: %r" % path)
                    write_file("/mnt", path[len("/mnt/") :], data, hdr["uid"])
                else:
                    write_file(work, path, data, hdr["uid"])
        except OSError as e:
            result["input_error"] = "bad input file: %s" % (e.strerror or e)  # (names the path: `run_files`)
            send_frame(sock, result)
            return
        for step in hdr["steps"]:
            try:
                st, out, err = self._step(hdr, work, step, stdin if step.get("stdin") else None)
            except LimitNotApplied as e:
                result["setup_error"] = str(e)
                break
            result["steps"].append(st)
            out_blobs += [out, err]
            if st["status"] != "Finished" or st["return_code"] != 0:
                break
        files, fds, skipped = fetch_files(work, hdr, self.isolate)
        result["files"], result["not_fetched"] = files, skipped
        try:
            send_frame(sock, result, out_blobs, fds)
        finally:
            for fd, _ in fds:
                os.close(fd)

    # -- one step (compile or run) -----------------------------------------------------------
    def _step(self, hdr, work, step, stdin):
        self._set_memory(step["mem_mb"] << 20)  # (the run's cgroup holds the program's pages only)
        oom0 = self._oom_kills()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        if stdin is not None:
            in_fd = os.memfd_create("stdin", 0)
            os.write(in_fd, stdin)
            os.lseek(in_fd, 0, 0)
        else:
            in_fd = os.open("/dev/null", os.O_RDONLY)
        self.seq += 1
        env = hdr["env"]
        req = {
            "seq": self.seq,
            "step": step,
            "uid": hdr["uid"],
            "env": None if env == self.slot.warm_state.env else env,
            "work": work,  # (None: the warm one)
            "max_processes": hdr["max_processes"],
            "max_file_mb": hdr["max_file_mb"],
            "max_open_files": hdr["max_open_files"],
        }
        msg, fds = json.dumps(req).encode(), [in_fd, out_w, err_w, *self.run_ns]
        if len(msg) > FORK_MSG_MAX:  # (a long command or environment: the request goes in a memfd, sent last)
            big = os.memfd_create("request", os.MFD_CLOEXEC)
            os.write(big, msg)
            msg, fds = b'{"seq": %d, "in_memfd": true}' % self.seq, fds + [big]
        t0 = time.monotonic()
        try:
            socket.send_fds(self.forker, [msg], fds)
        finally:
            for fd in (out_w, err_w, in_fd, *fds[5 if self.isolate else 3 :]):
                os.close(fd)
        self.child = self.wstatus = self.cpu = None
        self.killing = False
        limit = hdr["max_output"]
        bufs = {out_r: bytearray(), err_r: bytearray()}
        poller, wake_r, forker = self.poller, self.wake_r, self.forker.fileno()
        watched = {out_r, err_r, self.sock_fd}
        for fd in watched:  # (a pipe is read once per readiness: it never blocks, no O_NONBLOCK needed)
            poller.register(fd, select.EPOLLIN)
        deadline = t0 + step["timeout"]
        status, notes, flooded, memory_exceeded = "Finished", [], [], False
        open_pipes = set(bufs)
        try:
            while open_pipes or self.wstatus is None:
                left = None
                if self.wstatus is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        if self.killing:
                            raise RuntimeError("the fork server did not report the end of the program")
                        status = "TimeLimitExceeded"
                        self._kill_all()
                        deadline = time.monotonic() + 30  # (its end is reported at once: a bound, no wait)
                        continue
                orphans = False
                for fd, _ in poller.poll(-1 if left is None else left):
                    if fd == wake_r:  # a signal: SIGCHLD (an orphan of the run to reap), or forwarded
                        orphans = True
                        try:
                            os.read(wake_r, 4096)
                        except BlockingIOError:
                            pass
                    elif fd == forker:
                        self._from_forker()
                    elif fd == self.sock_fd:  # the server asked us to stop (a STOP byte, read), or is gone
                        try:
                            os.read(fd, 1)  # (nothing else comes before our answer)
                        except OSError:
                            pass
                        if self.wstatus is None:
                            status = "Killed"
                            self._kill_all()
                        poller.unregister(fd)
                        watched.discard(fd)
                    elif fd in open_pipes:
                        try:
                            chunk = os.read(fd, 65536)
                        except BlockingIOError:
                            continue
                        if not chunk:
                            open_pipes.discard(fd)
                            poller.unregister(fd)
                            watched.discard(fd)
                            continue
                        buf = bufs[fd]
                        room = limit - len(buf)
                        buf += chunk[: max(0, room)]
                        if len(chunk) > room and self.wstatus is None:
                            flooded.append("stdout" if fd == out_r else "stderr")
                            self._kill_all()
                if orphans:
                    self._reap(block=False)
        finally:
            for fd in watched:
                poller.unregister(fd)
            os.close(out_r)
            os.close(err_r)
        elapsed = time.monotonic() - t0
        wstatus, cpu = self.wstatus, self.cpu
        self.child = None
        rc = -os.WTERMSIG(wstatus) if os.WIFSIGNALED(wstatus) else os.WEXITSTATUS(wstatus)
        if flooded:
            status = "Error"
            notes.append(
                "output limit exceeded on %s (%d bytes): the run was killed" % (", ".join(sorted(set(flooded))), limit)
            )
        elif status == "Finished":
            if self._oom_kills() > oom0:
                memory_exceeded = True
                notes.append("memory limit exceeded (%d MB for the whole run): a process was killed" % step["mem_mb"])
            elif cpu_limit_killed(rc, cpu, step["cpu_s"]):
                status = "TimeLimitExceeded"  # (as a wall-clock timeout: one thread or many, the same answer)
                notes.append("CPU time limit exceeded (%ds)" % step["cpu_s"])
            elif rc == -signal.SIGXFSZ:
                notes.append("file size limit exceeded (%d MB)" % hdr["max_file_mb"])
        if status == "Killed":
            status = "Error"
            notes.append("the run was stopped by the server")
        st = {
            "kind": step.get("kind", "run"),
            "status": status,
            "execution_time": round(elapsed, 4),
            "memory_exceeded": memory_exceeded,
            "return_code": None if status == "TimeLimitExceeded" else rc,
            "cpu_time": round(cpu, 4) if cpu is not None else None,
            "notes": notes,
            "stdout_size": len(bufs[out_r]),
            "stderr_size": len(bufs[err_r]),
        }
        return st, bytes(bufs[out_r]), bytes(bufs[err_r])

    def _from_forker(self):
        msg = self.forker.recv(4096)
        if not msg:
            raise EOFError("the fork server is gone")
        m = json.loads(msg)
        if m.get("seq") != self.seq:
            return  # (a late answer about an earlier step: never happens while steps wait for their end)
        if m.get("error"):
            raise OSError(m["error"])
        if "pid" in m:
            self.child = m["pid"]
            if self.killing:
                self._kill_all()
        if "exit" in m:
            self.wstatus, self.cpu = m["exit"], m["cpu"]
            self._kill_all()  # the program is done: so is everything it left behind

    def _kill_all(self):
        """Kill every process of the run; reap those that are ours (the program is the fork
        server's child: it reports the program's end)."""
        self.killing = True
        if not self.isolate:
            if self.child:
                try:
                    os.killpg(self.child, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return
        while True:  # PID 1 of the namespace: kill(-1) reaches every process but us; repeat
            try:  # until no child is left (a fork racing one kill(-1) is caught by the next)
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.wait4(-1, 0)
            except ChildProcessError:
                return

    @staticmethod
    def _reap(block):
        """Reap the run's orphans (they are re-parented to this init)."""
        while True:
            try:
                wpid, _, _ = os.wait4(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return
            if wpid == 0:
                return
