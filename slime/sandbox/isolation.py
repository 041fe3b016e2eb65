"""A slot's isolation, built once per slot by its fork server (stdlib only: the *run* interpreter
imports it, never slime).

Why once per slot: namespaces and a minimal root cost milliseconds to build; every run of the slot
then inherits them for free. What a slot gets: a private network namespace with only loopback (up,
no route out), private UTS and cgroup namespaces, and a private mount namespace whose root is a
read-only minimal tree (``/usr`` and the interpreters' prefixes bound read-only, a synthetic
``/etc``, a few device nodes; nothing of the host's data but the ``--ro-bind``s, nested below these
and below each run's own ``/tmp``, ``/mnt``, ``/home``). Also the seccomp filter every program process
installs on itself (no namespaces, mounts, ptrace, bpf, keyrings ...).
"""

import ctypes
import errno
import os
import socket
import struct

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x08000000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 38, 22, 2
SYS_PIVOT_ROOT = 155  # x86_64
SOCKET_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)  # the only ones a program may create
NETLINK_ROUTE = 0

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def check(rc, what):
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))


def mount(src, dst, fstype, flags, data=None):
    enc = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
    check(libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)), "mount %s on %s" % (src, dst))


# ------------------------------------------------------------------------------ seccomp
def _seccomp_program():
    """x86_64 filter: deny namespace, mount, tracing, kernel-module, bpf, keyring syscalls; sockets
    of any family but `SOCKET_FAMILIES` (and netlink's route protocol, which ``getaddrinfo`` and
    ``ip`` use) fail with EAFNOSUPPORT: the network namespace does not cover them all (``AF_VSOCK``
    shares the VM's port space), and a family added to the kernel later is refused as well.

    ``setns`` stays allowed: the fork server, which installs the filter on itself (so that every
    program inherits it, with no per-run cost), joins each run's namespaces with it. A program
    cannot use it: joining a namespace needs CAP_SYS_ADMIN, which it never has (an ordinary uid,
    ``no_new_privs``, and no user namespace of its own: those are denied here)."""
    deny = [
        272,
        165,
        166,
        155,
        161,
        101,
        310,
        311,
        246,
        320,
        175,
        313,
        176,
        169,
        167,
        168,
        321,
        298,
        323,
        250,
        248,
        249,
        304,
        303,
        425,
        426,
        427,
        428,
        429,
        430,
        431,
        432,
        442,
        163,
        164,
        227,
        159,
        179,
        153,
        172,
        173,
        103,
    ]
    ns_flags = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, KILL, EPERM, ENOSYS = 0x7FFF0000, 0x80000000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    NOFAMILY, NOPROTO = 0x00050000 | errno.EAFNOSUPPORT, 0x00050000 | errno.EPROTONOSUPPORT
    prog = [(LD, 0, 0, 4), (JEQ, 1, 0, 0xC000003E), (RET, 0, 0, KILL), (LD, 0, 0, 0)]
    # labels resolved below: ("J", op, k, target)
    body = [("J", JGE, 0x40000000, "deny"), ("J", JEQ, 435, "nosys"), ("J", JEQ, 56, "clone")]
    body += [("J", JEQ, nr, "deny") for nr in deny]
    body += [("J", JEQ, nr, "socket") for nr in (41, 53)]  # socket, socketpair: by address family
    body += [
        ("R", ALLOW),
        ("L", "clone"),
        (LD, 0, 0, 16),
        ("J", JSET, ns_flags, "deny"),
        ("R", ALLOW),
        ("L", "socket"),
        (LD, 0, 0, 16),
    ]
    body += [("J", JEQ, family, "allow") for family in SOCKET_FAMILIES]
    body += [
        ("J", JEQ, socket.AF_NETLINK, "netlink"),
        ("R", NOFAMILY),
        ("L", "netlink"),
        (LD, 0, 0, 32),
        ("J", JEQ, NETLINK_ROUTE, "allow"),
        ("R", NOPROTO),
        ("L", "allow"),
        ("R", ALLOW),
        ("L", "deny"),
        ("R", EPERM),
        ("L", "nosys"),
        ("R", ENOSYS),
    ]
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
    """The filter, built and installed once per slot, by the fork server on itself."""

    def __init__(self):
        code, n = _seccomp_program()
        self._buf = ctypes.create_string_buffer(code, len(code))
        self._fprog = _SockFprog(n, ctypes.cast(self._buf, ctypes.c_void_p))
        self._ref = ctypes.byref(self._fprog)

    def install(self):
        check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self._ref, 0, 0), "seccomp")


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
    if not os.path.lexists(dst):  # (under /usr it exists already: checked at start, `ro_binds.py`)
        if is_dir:
            os.makedirs(dst)
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            open(dst, "a").close()
    mount(src, dst, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (MS_NODEV if is_dir else 0)
    mount(None, dst, None, flags)
    if is_dir:  # the submounts MS_REC brought along are read-only too
        with open("/proc/self/mountinfo") as f:
            subs = [line.split()[4] for line in f if line.split()[4].startswith(dst + "/")]
        for sub in subs:
            mount(None, sub.replace("\\040", " "), None, flags)


# ------------------------------------------------------------------------------ --ro-bind, nested
# A bind below a directory each run gets fresh is made again in every run, on the run's tmpfs;
# /home and /workspace are links into /mnt.
LINKED = {"/home": "/mnt/home", "/workspace": "/mnt/workspace"}
RUN_DIRS = ("/tmp", "/mnt", "/home", "/workspace")
STAGED = "/tmp/.ro-binds"  # in the slot's root, where such binds wait: under every run's own /tmp, unseen


def run_binds(cfg):
    """``{index in cfg["ro_binds"]: its real path in a run}`` of the binds nested per run."""
    out = {}
    for i, (_, inside) in enumerate(cfg.get("ro_binds") or []):
        top = next((t for t in RUN_DIRS if inside.startswith(t + "/")), None)
        if top is not None:
            out[i] = LINKED.get(top, top) + inside[len(top) :]
    return out


def _bind_host_paths(root, cfg, fds):
    """Each ``--ro-bind`` into the root being built: at its own place, or kept for the runs."""
    nested = run_binds(cfg)
    for i, ((_, inside), fd) in enumerate(zip(cfg.get("ro_binds") or [], fds)):
        if fd is None:  # the host's own path under /usr: shown already
            continue
        dst = "%s/%d" % (STAGED, i) if i in nested else inside
        fd_path = "/proc/self/fd/%d" % fd  # (the host path itself may be under the tmpfs now)
        _bind_ro(fd_path, os.path.join(root, dst.lstrip("/")), os.path.isdir(fd_path))
        os.close(fd)
    for link, target in LINKED.items():  # (a session makes them too; runs get them only for a bind below)
        if any(path.startswith(target + "/") for path in nested.values()):
            os.symlink(target, os.path.join(root, link.lstrip("/")))


def hold_run_binds(cfg):
    """In a run's fresh mount namespace, before its /tmp covers the slot's: ``[(fd, path)]``, this
    namespace's copy of each bind nested per run (`nest_run_binds`) and where it goes."""
    return [(os.open("%s/%d" % (STAGED, i), os.O_PATH | os.O_CLOEXEC), path) for i, path in run_binds(cfg).items()]


def nest_run_binds(held, uid):
    """Once the run's /tmp and /mnt are in place: each held bind at its own path below them, the
    directories above it made on the run's tmpfs (the run's uid owns them: the rest of its /tmp stays
    its own). A bind keeps the flags of what it copies (read-only, nosuid, nodev), submounts' too."""
    for fd, path in held:
        _make_dirs(os.path.dirname(path), uid)
        src = "/proc/self/fd/%d" % fd
        if os.path.isdir(src):
            os.mkdir(path, 0o755)
        else:
            open(path, "a").close()
        mount(src, path, None, MS_BIND | MS_REC)
        os.close(fd)


def _make_dirs(path, uid):
    """``mkdir -p`` on the run's tmpfs, each directory it makes the run's uid's."""
    if os.path.isdir(path):
        return
    _make_dirs(os.path.dirname(path), uid)
    os.mkdir(path, 0o755)
    os.chown(path, uid, uid)


# ------------------------------------------------------------------------------ the slot's root
def _build_root(cfg):
    """A read-only minimal root, built on a tmpfs over /tmp (in our private mount namespace: the
    host sees nothing, so nothing is left on its disk), then pivot into it."""
    root = "/tmp"
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    # held open before the tmpfs goes over /tmp: a checkout under the host's /tmp stays reachable
    # (None: the host's own path under /usr at that path, shown already: `ro_binds.already_visible`)
    from_ro_binds = [
        None if src == inside and (inside + "/").startswith("/usr/") else os.open(src, os.O_PATH | os.O_CLOEXEC)
        for src, inside in cfg.get("ro_binds") or []
    ]
    # (few mounts: each one is copied into, and torn down with, every run's mount namespace)
    mount("tmpfs", root, "tmpfs", MS_NOSUID, "size=4m,mode=0755")
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), os.path.join(root, name))
        elif os.path.isdir(host):
            _bind_ro(host, os.path.join(root, name))
    _bind_ro("/usr", os.path.join(root, "usr"))
    _write_etc(os.path.join(root, "etc"), cfg["uid"])
    _bind_host_paths(root, cfg, from_ro_binds)  # (after /usr and /etc: one may nest below them)
    _make_dev(os.path.join(root, "dev"))
    for d in ("proc", "tmp", "mnt", ".old"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    os.chmod(os.path.join(root, "tmp"), 0o1777)
    os.chdir(root)
    check(libc.syscall(SYS_PIVOT_ROOT, b".", b".old"), "pivot_root")
    os.chdir("/")
    check(libc.umount2(b"/.old", MNT_DETACH), "detach the host root")
    os.rmdir("/.old")
    mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)


def _write_etc(etc, uid):
    """A synthetic /etc: the users and names a slot knows, the loader's cache, the alternatives links."""
    os.makedirs(etc)
    # (`agent` is the same uid: agent harnesses name their user so; a session's /home/agent is its home)
    files = {
        "passwd": "root:x:0:0:root:/root:/bin/sh\nsandbox:x:%d:%d:sandbox:/tmp:/bin/sh\n"
        "agent:x:%d:%d:agent:/home/agent:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n" % (uid, uid, uid, uid),
        "group": "root:x:0:\nsandbox:x:%d:\nagent:x:%d:\nnogroup:x:65534:\n" % (uid, uid),
        "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        "hostname": "sandbox\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
    }
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


def _make_dev(dev):
    os.makedirs(os.path.join(dev, "shm"))
    for name in ("null", "zero", "full", "random", "urandom"):
        st = os.stat("/dev/" + name)
        os.mknod(os.path.join(dev, name), 0o666 | (st.st_mode & 0o170000), st.st_rdev)
        os.chmod(os.path.join(dev, name), 0o666)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, os.path.join(dev, name))


def enter_slot(cfg, in_cgroup_namespace=None):
    """Leave the host's network, UTS, mount and cgroup namespaces for the slot's own (root only);
    `in_cgroup_namespace()` runs once in them, before the host's files are gone. Returns fds of
    the slot's IPC and mount namespaces (to come back to after each fork)."""
    check(libc.unshare(CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWNS | CLONE_NEWCGROUP), "unshare")
    if in_cgroup_namespace is not None:
        in_cgroup_namespace()
    base = [
        (os.open("/proc/self/ns/ipc", os.O_RDONLY | os.O_CLOEXEC), CLONE_NEWIPC),
        (os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC), CLONE_NEWNS),
    ]  # (/proc: still the host's)
    _loopback_up()
    socket.sethostname("sandbox")
    _build_root(cfg)
    return base
