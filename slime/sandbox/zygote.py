"""Fork server of one sandbox slot, run by the *run* interpreter (stdlib only, never imports slime).

Why a fork server: a fresh ``python3`` costs an interpreter start per run; this process starts
once per slot, loads the interpreter and common modules, builds the slot's isolation once, and
then forks one fresh, isolated run per request.

Set up once (root): join the slot's cgroups, enter a private network namespace with loopback
up (no other interface, so no route out), private UTS and cgroup namespaces, and a private mount
namespace whose root is a read-only minimal tree (``/usr`` and the interpreters' prefixes bound
read-only, a synthetic ``/etc``, a few device nodes; nothing else of the host).

Then it forks once into a PID namespace of its own and serves as its PID 1, the slot's init
(root, never changing credentials, so its ``PR_SET_PDEATHSIG`` tied to this process holds; the
parent's own is tied to the server). A slot runs one request at a time. Per run the init
enters a new mount and IPC namespace with one size-limited tmpfs as ``/tmp`` (the cwd) and
``/dev/shm``, and forks the program as an ordinary process (self-signals and ``abort()`` behave
as outside) under the slot's uid with rlimits, ``no_new_privs`` and a seccomp filter (no
namespaces, mounts, ptrace, bpf, keyrings ...). It reaps orphans, forwards signals, reads the
program's output (capped), enforces the wall-clock timeout, kills every process of the
namespace when the program ends, returns output and requested files over a socket, and leaves
the run's namespaces (the tmpfs goes with them). When the server dies, both processes die
(pdeathsig, and EOF on the control socket), and with the PID namespace every process of a run.

Protocol: the control socket (SOCK_SEQPACKET) carries ``{"op": "run"}`` with one attached
stream socket; on it ``<u32 length><JSON header><blobs>`` both ways.
"""

import ctypes
import errno
import io
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x08000000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 38, 22, 2
SYS_PIVOT_ROOT = 155  # x86_64

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _check(rc, what):
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))


def _mount(src, dst, fstype, flags, data=None):
    enc = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
    _check(_libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)), "mount %s on %s" % (src, dst))


# ------------------------------------------------------------------------------ framing
def send_frame(sock, header, blobs=()):
    data = json.dumps(header).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)
    for b in blobs:
        if b:
            sock.sendall(b)


def _recv_exact(sock, n):
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise EOFError("peer closed")
        got += k
    return bytes(buf)


def recv_frame(sock):
    (n,) = struct.unpack("!I", _recv_exact(sock, 4))
    return json.loads(_recv_exact(sock, n))


# ------------------------------------------------------------------------------ seccomp
def _seccomp_program():
    """x86_64 filter: deny namespace, mount, tracing, kernel-module, bpf, keyring syscalls."""
    deny = [272, 308, 165, 166, 155, 161, 101, 310, 311, 246, 320, 175, 313, 176, 169, 167, 168, 321, 298,
            323, 250, 248, 249, 304, 303, 425, 426, 427, 428, 429, 430, 431, 432, 442, 163, 164, 227, 159, 179,
            153, 172, 173, 103]
    ns_flags = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, KILL, EPERM, ENOSYS = 0x7FFF0000, 0x80000000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    prog = [(LD, 0, 0, 4), (JEQ, 1, 0, 0xC000003E), (RET, 0, 0, KILL), (LD, 0, 0, 0)]
    # labels resolved below: ("J", op, k, target)
    body = [("J", JGE, 0x40000000, "deny"), ("J", JEQ, 435, "nosys"), ("J", JEQ, 56, "clone")]
    body += [("J", JEQ, nr, "deny") for nr in deny]
    body += [("R", ALLOW), ("L", "clone"), (LD, 0, 0, 16), ("J", JSET, ns_flags, "deny"), ("R", ALLOW),
             ("L", "deny"), ("R", EPERM), ("L", "nosys"), ("R", ENOSYS)]
    labels, pos = {}, len(prog)
    for item in body:
        if item[0] == "L":
            labels[item[1]] = pos
        else:
            pos += 1
    for item in body:
        if item[0] == "L":
            continue
        if item[0] == "R":
            prog.append((RET, 0, 0, item[1]))
        elif item[0] == "J":
            prog.append((item[1], labels[item[3]] - len(prog) - 1, 0, item[2]))
        else:
            prog.append(item)
    return b"".join(struct.pack("HBBI", *ins) for ins in prog), len(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Seccomp:
    """The filter, built once per slot; `install()` is one prctl in the program's process."""

    def __init__(self):
        code, n = _seccomp_program()
        self._buf = ctypes.create_string_buffer(code, len(code))
        self._fprog = _SockFprog(n, ctypes.cast(self._buf, ctypes.c_void_p))
        self._ref = ctypes.byref(self._fprog)

    def install(self):
        _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self._ref, 0, 0), "seccomp")


# ------------------------------------------------------------------------------ slot set-up
def _loopback_up():
    import fcntl

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifr = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, ifr)[:18])[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 1, b""))
    finally:
        s.close()


def _bind_ro(src, dst, is_dir=True):
    if is_dir:
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    _mount(src, dst, None, MS_BIND | MS_REC)
    _mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (MS_NODEV if is_dir else 0))


def _build_root(cfg):
    """A read-only minimal root, built on a tmpfs over /tmp (in our private mount namespace: the
    host sees nothing, so nothing is left on its disk), then pivot into it."""
    root = "/tmp"
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # (few mounts: each one is copied into, and torn down with, every run's mount namespace)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID, "size=4m,mode=0755")
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), os.path.join(root, name))
        elif os.path.isdir(host):
            _bind_ro(host, os.path.join(root, name))
    for src in ["/usr"] + list(cfg.get("ro_paths") or []):
        if os.path.exists(src) and not os.path.join(root, src.lstrip("/")).startswith(os.path.join(root, "usr/")):
            _bind_ro(src, os.path.join(root, src.lstrip("/")), os.path.isdir(src))
    etc = os.path.join(root, "etc")
    os.makedirs(etc)
    uid = cfg["uid"]
    files = {"passwd": "root:x:0:0:root:/root:/bin/sh\nsandbox:x:%d:%d:sandbox:/tmp:/bin/sh\n"
                       "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n" % (uid, uid),
             "group": "root:x:0:\nsandbox:x:%d:\nnogroup:x:65534:\n" % uid,
             "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
             "hostname": "sandbox\n", "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n"}
    for name, text in files.items():
        with open(os.path.join(etc, name), "w") as f:
            f.write(text)
    if os.path.isfile("/etc/ld.so.cache"):  # the loader's cache
        with open("/etc/ld.so.cache", "rb") as src, open(os.path.join(etc, "ld.so.cache"), "wb") as dst:
            dst.write(src.read())
    if os.path.isdir("/etc/alternatives"):  # /usr/bin links through alternatives: copy the links
        os.makedirs(os.path.join(etc, "alternatives"))
        for name in os.listdir("/etc/alternatives"):
            host = os.path.join("/etc/alternatives", name)
            if os.path.islink(host):
                os.symlink(os.readlink(host), os.path.join(etc, "alternatives", name))
    os.symlink("/usr/share/zoneinfo/Etc/UTC", os.path.join(etc, "localtime"))
    dev = os.path.join(root, "dev")
    os.makedirs(os.path.join(dev, "shm"))
    for name in ("null", "zero", "full", "random", "urandom"):
        st = os.stat("/dev/" + name)
        os.mknod(os.path.join(dev, name), 0o666 | (st.st_mode & 0o170000), st.st_rdev)
        os.chmod(os.path.join(dev, name), 0o666)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, os.path.join(dev, name))
    for d in ("proc", "tmp", ".old"):
        os.makedirs(os.path.join(root, d))
    os.chmod(os.path.join(root, "tmp"), 0o1777)
    os.chdir(root)
    _check(_libc.syscall(SYS_PIVOT_ROOT, b".", b".old"), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "detach the host root")
    os.rmdir("/.old")
    _mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)


def _cgroup_usage(cfg):
    for p in cfg.get("cg_usage") or []:
        try:
            with open(p) as f:
                return int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return 0


class Slot:
    """One slot's fork server (runs in this process until the control socket closes)."""

    def __init__(self, cfg, ctl):
        self.cfg, self.ctl = cfg, ctl
        self.isolate = cfg["isolate"]
        self.seccomp = Seccomp() if (self.isolate and os.uname().machine == "x86_64") else None
        self.cg_limit_fds = []  # opened before the pivot: the inits set each step's memory limit
        self.cg_oom_fds = []
        self.base_bytes = 0
        self.base_ns = []
        self.vm_bytes = 0
        self.child = None
        self.mem_limit = None
        self.wake_r = self.sel = None
        # signals with a handler here (Python's, ours): reset to default in the program's process
        self.handled_signals = [signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGTERM,
                                signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2]

    def setup(self):
        cfg = self.cfg
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() == 1:
            os._exit(1)
        for p in cfg.get("cg_procs") or []:
            with open(p, "w") as f:
                f.write("0")
        for p in cfg.get("cg_limits") or []:
            self.cg_limit_fds.append(os.open(p, os.O_WRONLY | os.O_CLOEXEC))
        for p in cfg.get("cg_oom") or []:
            self.cg_oom_fds.append(os.open(p, os.O_RDONLY | os.O_CLOEXEC))
        if self.isolate:
            _check(_libc.unshare(CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWNS | CLONE_NEWCGROUP), "unshare")
            _loopback_up()
            socket.sethostname("sandbox")
            _build_root(cfg)
        os.environ.clear()
        os.environ.update(cfg["env"])
        for mod in cfg.get("preload") or []:
            try:
                __import__(mod)
            except Exception:  # noqa: BLE001 - a missing optional module is no reason to fail
                pass
        self.base_bytes = _cgroup_usage(cfg)

    def _forward(self, signum, _frame):
        if self.child:
            try:
                os.kill(self.child, signum)
            except ProcessLookupError:
                pass

    def serve(self):
        """Become PID 1 of the slot's PID namespace (a forked child; we stay as its parent) and
        serve runs one after the other: a slot has at most one run at a time."""
        if self.isolate:
            _check(_libc.unshare(CLONE_NEWPID), "unshare(pid)")
            pid = os.fork()
            if pid:
                self.ctl.close()
                while True:
                    try:
                        _, st = os.waitpid(pid, 0)
                        break
                    except InterruptedError:
                        continue
                os._exit(1)
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            # /proc of this namespace; hidepid: a run sees its own processes, never this init (root)
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
            self.base_ns = [(os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC), CLONE_NEWNS),
                            (os.open("/proc/self/ns/ipc", os.O_RDONLY | os.O_CLOEXEC), CLONE_NEWIPC)]
        # once per slot: SIGCHLD wakes the init's select loop; signals it gets go to the program
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *a: None)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, self._forward)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.wake_r, selectors.EVENT_READ)
        import gc

        gc.collect()
        gc.freeze()
        with open("/proc/self/statm") as f:
            self.vm_bytes = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") + (8 << 20)
        self.ctl.sendmsg([json.dumps({"ready": True, "base_bytes": self.base_bytes,
                                      "seccomp": self.seccomp is not None}).encode()])
        while True:
            try:
                msg, fds, _, _ = socket.recv_fds(self.ctl, 65536, 4)
            except OSError:
                msg, fds = b"", []
            if not msg:
                os._exit(0)  # the server is gone: so is this namespace, and with it any run
            req = json.loads(msg)
            if req.get("op") != "run" or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                continue
            sock = socket.socket(fileno=fds[0])
            try:
                _Init(self, sock, req).main()
            finally:
                sock.close()
                if self.isolate:
                    for fd, kind in self.base_ns:  # leave the run's namespaces: its tmpfs goes with them
                        _check(_libc.setns(fd, kind), "setns back")


# ------------------------------------------------------------------------------ one run
class _Init:
    """One run, done by the slot's PID 1: prepares it, runs its steps, reaps, forwards signals,
    kills what is left, reports."""

    def __init__(self, slot, sock, req):
        self.slot, self.sock = slot, sock
        self.req = req
        self.child = None

    def main(self):
        try:
            self._main()
        except Exception as e:  # noqa: BLE001 - reported to the server, never to the program's streams
            try:
                self._kill_all()
                send_frame(self.sock, {"error": "%s: %s" % (type(e).__name__, e), "steps": [], "files": []})
            except Exception:  # noqa: BLE001
                pass

    def _main(self):
        sock = self.sock
        self.wstatus = self.rusage = None
        hdr = recv_frame(sock)
        blobs = []
        for _path, size in hdr["files"]:
            blobs.append(_recv_exact(sock, size))
        code_blob = _recv_exact(sock, hdr["code_size"])
        stdin = _recv_exact(sock, hdr["stdin_size"]) if hdr["stdin_size"] >= 0 else None
        result = {"steps": [], "files": []}
        out_blobs = []
        try:
            work = self._prepare(hdr)
            self._write(work, hdr["source"], code_blob, hdr["uid"])
            for (path, _), data in zip(hdr["files"], blobs):
                self._write(work, path, data, hdr["uid"])
        except OSError as e:
            result["input_error"] = "bad input file: %s" % (e.strerror or e)
            send_frame(sock, result)
            return
        for step in hdr["steps"]:
            st, out, err = self._step(hdr, work, step, stdin if step.get("stdin") else None)
            result["steps"].append(st)
            out_blobs += [out, err]
            if st["status"] != "Finished" or st["return_code"] != 0:
                break
        files, fblobs = self._fetch(work, hdr)
        result["files"] = files
        send_frame(sock, result, out_blobs + fblobs)
        sock.shutdown(socket.SHUT_WR)

    def _fetch(self, work, hdr):
        """Requested files, each resolved file once (aliases dropped), within the size caps."""
        seen, files, blobs, total = set(), [], [], 0
        for name, rel in hdr["fetch"]:
            real = os.path.realpath(os.path.join(work, rel))
            if not real.startswith(work + "/") or real in seen:
                continue
            try:
                fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                size = os.fstat(fd).st_size
                import stat as _stat

                if not _stat.S_ISREG(os.fstat(fd).st_mode) or size > hdr["fetch_max_file"] \
                        or total + size > hdr["fetch_max_total"]:
                    continue
                chunks, got = [], 0
                while got < size:
                    b = os.read(fd, min(1 << 20, size - got))
                    if not b:
                        break
                    chunks.append(b)
                    got += len(b)
            finally:
                os.close(fd)
            data = b"".join(chunks)
            seen.add(real)
            total += len(data)
            files.append([name, len(data)])
            blobs.append(data)
        return files, blobs

    # -- set-up ----------------------------------------------------------------------------
    def _prepare(self, hdr):
        uid = hdr["uid"]
        if not self.slot.isolate:
            return hdr["workdir"]
        _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare(mnt,ipc)")
        size = "size=%dk,nr_inodes=%d,mode=0755" % (hdr["disk_mb"] << 10, hdr.get("max_inodes", 65536))
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, size)
        for d in ("t", "s"):
            os.mkdir("/dev/shm/" + d, 0o1777 if d == "s" else 0o755)
            os.chown("/dev/shm/" + d, uid, uid)
        _mount("/dev/shm/t", "/tmp", None, MS_BIND)
        _mount("/dev/shm/s", "/dev/shm", None, MS_BIND)
        return "/tmp"

    @staticmethod
    def _write(work, path, data, uid):
        rel = os.path.normpath(path)
        if rel.startswith("/") or rel == ".." or rel.startswith("../"):
            raise OSError(errno.EINVAL, "path escapes the work dir: %r" % path)
        full = os.path.join(work, rel)
        d = os.path.dirname(full)
        todo = []
        while d != work and not os.path.isdir(d):
            todo.append(d)
            d = os.path.dirname(d)
        for d in reversed(todo):
            os.mkdir(d, 0o755)
            os.chown(d, uid, uid)
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchown(fd, uid, uid)
        finally:
            os.close(fd)

    def _set_memory(self, limit_bytes):
        if limit_bytes == self.slot.mem_limit:
            return
        self.slot.mem_limit = limit_bytes
        # memsw (v1) must stay >= the limit: write it, the limit, and it again (works both ways)
        fds = self.slot.cg_limit_fds
        for fd in fds[1:] + fds + fds[1:]:
            try:
                os.pwrite(fd, str(limit_bytes).encode(), 0)
            except OSError:
                pass

    def _oom_kills(self):
        n = 0
        for fd in self.slot.cg_oom_fds:
            try:
                os.lseek(fd, 0, 0)
                for line in os.read(fd, 4096).decode().splitlines():
                    k, _, v = line.partition(" ")
                    if k == "oom_kill":
                        n += int(v)
            except (OSError, ValueError):
                pass
        return n

    # -- one step (compile or run) -----------------------------------------------------------
    def _step(self, hdr, work, step, stdin):
        mem = step["mem_mb"] << 20
        self._set_memory(mem + self.slot.base_bytes + (48 << 20))
        oom0 = self._oom_kills()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        if stdin is not None:
            in_fd = os.memfd_create("stdin", 0)
            os.write(in_fd, stdin)
            os.lseek(in_fd, 0, 0)
        else:
            in_fd = os.open("/dev/null", os.O_RDONLY)
        slot = self.slot
        wake_r, sel = slot.wake_r, slot.sel
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            try:
                self._exec(hdr, work, step, in_fd, out_w, err_w)
            finally:
                os._exit(127)
        self.child = slot.child = pid
        for fd in (out_w, err_w, in_fd):
            os.close(fd)
        limit = hdr["max_output"]
        bufs = {out_r: bytearray(), err_r: bytearray()}
        for fd in bufs:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        sel.register(self.sock.fileno(), selectors.EVENT_READ)
        deadline = t0 + step["timeout"]
        status, notes, flooded = "Finished", [], []
        self.wstatus = self.rusage = None
        open_pipes = set(bufs)
        while open_pipes or self.wstatus is None:
            left = None
            if self.wstatus is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    status = "TimeLimitExceeded"
                    self._kill_all()
                    continue
            for key, _ in sel.select(left):
                fd = key.fd
                if fd == wake_r:
                    try:
                        os.read(wake_r, 4096)
                    except BlockingIOError:
                        pass
                elif fd == self.sock.fileno():  # the server asked us to stop, or is gone
                    if self.wstatus is None:
                        status = "Killed"
                        self._kill_all()
                    sel.unregister(fd)
                elif fd in open_pipes:
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        open_pipes.discard(fd)
                        sel.unregister(fd)
                        continue
                    buf = bufs[fd]
                    room = limit - len(buf)
                    buf += chunk[:max(0, room)]
                    if len(chunk) > room and self.wstatus is None:
                        flooded.append("stdout" if fd == out_r else "stderr")
                        self._kill_all()
            if self.wstatus is None:
                self._reap(block=False)
                if self.wstatus is not None:
                    self._kill_all()  # the program is done: so is everything it left behind
        wstatus, rusage = self.wstatus, self.rusage
        elapsed = time.monotonic() - t0
        for fd in (out_r, err_r, self.sock.fileno()):
            if fd in sel.get_map():
                sel.unregister(fd)
            if fd != self.sock.fileno():
                os.close(fd)
        self.child = slot.child = None
        if os.WIFSIGNALED(wstatus):
            rc = -os.WTERMSIG(wstatus)
        else:
            rc = os.WEXITSTATUS(wstatus)
        cpu = rusage.ru_utime + rusage.ru_stime if rusage else None
        if flooded:
            status = "Error"
            notes.append("output limit exceeded on %s (%d bytes): the run was killed"
                         % (", ".join(sorted(set(flooded))), limit))
        elif status == "Finished":
            if self._oom_kills() > oom0:
                notes.append("memory limit exceeded (%d MB for the whole run): a process was killed" % step["mem_mb"])
            elif rc in (-signal.SIGXCPU, -signal.SIGKILL) and cpu is not None and cpu >= step["cpu_s"] - 0.05:
                notes.append("CPU time limit exceeded (%ds)" % step["cpu_s"])
            elif rc == -signal.SIGXFSZ:
                notes.append("file size limit exceeded (%d MB)" % hdr["max_file_mb"])
        if status == "Killed":
            status = "Error"
            notes.append("the run was stopped by the server")
        st = {"kind": step.get("kind", "run"), "status": status, "execution_time": round(elapsed, 4),
              "return_code": None if status == "TimeLimitExceeded" else rc,
              "cpu_time": round(cpu, 4) if cpu is not None else None, "notes": notes,
              "stdout_size": len(bufs[out_r]), "stderr_size": len(bufs[err_r])}
        return st, bytes(bufs[out_r]), bytes(bufs[err_r])

    def _kill_all(self):
        """Kill every process of the run and reap them all (the program's status is kept)."""
        if not self.slot.isolate:
            try:
                os.killpg(self.child, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._reap(block=True)
            return
        while True:  # PID 1 of the namespace: kill(-1) reaches every process but us; repeat
            try:  # until no child is left (a fork racing one kill(-1) is caught by the next)
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                wpid, wst, ru = os.wait4(-1, 0)
            except ChildProcessError:
                return
            if wpid == self.child and self.wstatus is None:
                self.wstatus, self.rusage = wst, ru

    def _reap(self, block):
        """Reap exited children; with block, until the program itself is reaped."""
        while True:
            try:
                wpid, wst, ru = os.wait4(-1, 0 if block and self.wstatus is None else os.WNOHANG)
            except ChildProcessError:
                return
            if wpid == 0:
                return
            if wpid == self.child and self.wstatus is None:
                self.wstatus, self.rusage = wst, ru
                if block:
                    return

    # -- the program's process ---------------------------------------------------------------
    def _exec(self, hdr, work, step, in_fd, out_w, err_w):
        uid = hdr["uid"]
        os.setsid()
        os.dup2(in_fd, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 1 << 16)
        signal.set_wakeup_fd(-1)
        for s in self.slot.handled_signals:
            signal.signal(s, signal.SIG_DFL)
        try:  # the program's processes go first when the run hits its memory limit (never the init)
            fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
            os.write(fd, b"1000")
            os.close(fd)
        except OSError:
            pass
        import resource

        cpu = step["cpu_s"]
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        mem = step["mem_mb"] << 20
        if step.get("warm_python"):  # the loaded interpreter's own address space comes on top
            mem += self.slot.vm_bytes
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_NPROC, (hdr["max_processes"], hdr["max_processes"]))
        fs = hdr["max_file_mb"] << 20
        resource.setrlimit(resource.RLIMIT_FSIZE, (fs, fs))
        resource.setrlimit(resource.RLIMIT_NOFILE, (hdr["max_open_files"], hdr["max_open_files"]))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.umask(0o022)
        os.chdir(work)
        if os.geteuid() == 0:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if self.slot.seccomp is not None:
            self.slot.seccomp.install()
        env = hdr["env"]
        if step.get("warm_python"):
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os._exit(_run_python(os.path.join(work, step["argv"][-1]), env, step["argv"]))
        argv = step["argv"]
        prog = argv[0]
        if "/" not in prog:
            for d in env.get("PATH", "").split(":"):
                if os.access(os.path.join(d, prog), os.X_OK):
                    prog = os.path.join(d, prog)
                    break
        try:
            os.execve(prog, argv, env)
        except OSError as e:
            os.write(2, ("%s: %s\n" % (argv[0], e.strerror)).encode())
            os._exit(127)


def _run_python(path, env, argv):
    """Run a script in this (already warm) interpreter as `python3 -u <script>` would."""
    import builtins
    import types

    if dict(os.environ) != env:
        os.environ.clear()
        os.environ.update(env)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                                 encoding="utf-8", errors="surrogateescape")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                                   errors="surrogateescape", write_through=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                                   errors="backslashreplace", write_through=True)
    script_dir = os.path.dirname(path)
    sys.argv = [os.path.basename(path)]
    sys.orig_argv = [sys.executable, os.path.basename(path)]
    sys.path.insert(0, script_dir)
    main = types.ModuleType("__main__")
    main.__dict__.update({"__file__": path, "__builtins__": builtins, "__cached__": None})
    sys.modules["__main__"] = main
    code = 0
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            src = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
        finally:
            os.close(fd)
        exec(compile(src, path, "exec"), main.__dict__)
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException as e:  # noqa: BLE001 - printed exactly as the interpreter would
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        e.__traceback__ = tb  # the interpreter prints the exception's own traceback: start at the script
        try:
            sys.excepthook(type(e), e, tb)
        except BaseException:  # noqa: BLE001
            pass
        code = 1
        if isinstance(e, KeyboardInterrupt):
            code = -signal.SIGINT
    code = _finalize(code)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _exit_code(e):
    c = e.code
    if c is None:
        return 0
    if isinstance(c, int):
        return c & 0xFF
    try:
        sys.stderr.write(str(c) + "\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


def _finalize(code):
    th = sys.modules.get("threading")
    try:
        if th is not None:
            th._shutdown()
    except BaseException:  # noqa: BLE001
        pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:  # noqa: BLE001
        pass
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except BaseException:  # noqa: BLE001
            if code == 0:
                code = 120
    return code


def main():
    ctl = socket.socket(fileno=int(sys.argv[1]))
    cfg = json.loads(ctl.recv(1 << 20))
    slot = Slot(cfg, ctl)
    try:
        slot.setup()
    except BaseException as e:  # noqa: BLE001 - reported to the server, which says why it cannot start
        import traceback

        where = traceback.extract_tb(e.__traceback__)[-1]
        ctl.sendmsg([json.dumps({"ready": False, "error": "%s: %s (zygote.py line %d)"
                                 % (type(e).__name__, e, where.lineno)}).encode()])
        os._exit(2)
    slot.serve()


if __name__ == "__main__":
    main()
