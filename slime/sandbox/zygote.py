"""Fork server of one sandbox slot, run by the *run* interpreter (stdlib only, never imports slime).

Why a fork server: a fresh ``python3`` costs an interpreter start per run; this process starts
once per slot, loads the interpreter and common modules, builds the slot's isolation once
(`isolation.py`: the slot's cgroups joined, the run's kept apart, namespaces, a read-only minimal root), and then forks every
program of the slot from that warm state (`program.py`).

It forks once more, at start, into a PID namespace of its own: that child is the slot's init
(`run_init.py`), which prepares each run and supervises it. The init asks for each program over a
socket; this process joins the run's namespaces, forks it, reports its end, and returns to the
slot's. It stays idle in between, so forking it is cheap: its memory is barely
written between forks, and the init's memory is never shared with a program at all.
``no_new_privs``, the seccomp filter, the run-independent rlimits, umask and the empty group list,
and the warm ``sys.std*`` streams are set once, here, after the init is started: every program
inherits them instead of setting them (each call a program makes costs it copy-on-write faults).

When the server dies, this process dies (pdeathsig, EOF on the control socket), the init with it
(pdeathsig), and with the init every process of its PID namespace.
"""

import gc
import json
import os
import signal
import socket
import struct
import sys
import types

PR_SET_PDEATHSIG = 1


def _load_siblings(sources):
    """isolation, program and run_init (with the modules run_init imports), from the sources the
    server sent, in the order sent (a module after those it imports), as one private package with
    neutral file names: this script itself arrives on stdin (``python3 -I -B -``), so no path of the
    host's checkout shows in a program's modules, code objects or command line; and nothing else is
    importable from the package (a program's ``import program`` finds its own)."""
    pkg = types.ModuleType("_slime_sandbox_slot")
    pkg.__path__ = []
    sys.modules[pkg.__name__] = pkg
    for name in sources:
        mod = types.ModuleType(pkg.__name__ + "." + name)
        mod.__file__ = "<slime-sandbox>/%s.py" % name
        mod.__package__ = pkg.__name__
        sys.modules[mod.__name__] = mod
        setattr(pkg, name, mod)
        exec(compile(sources[name], mod.__file__, "exec"), mod.__dict__)
    return [getattr(pkg, name) for name in ("isolation", "program", "run_init")]


isolation = program = run_init = None  # (set by `main` from the server's sources)


class Zygote:
    """One slot's fork server; its attributes are what the init inherits (`run_init.RunInit.slot`)."""

    def __init__(self, cfg, ctl, data):
        self.cfg, self.ctl, self.data = cfg, ctl, data
        self.isolate = cfg["isolate"]
        self.uid = cfg["uid"]
        self.disk_mb = cfg.get("disk_mb", 256)
        self.max_inodes = cfg.get("max_inodes", 65536)
        self.seccomp = isolation.Seccomp() if (self.isolate and os.uname().machine == "x86_64") else None
        self.cg_limit_fds = []  # opened before the pivot: the init sets (and reads back) each step's memory limit
        self.cg_oom_fds = []
        self.cg_usage_fds = []
        self.cg_run_fds = []  # each program joins the run's cgroup through these (`program.start`)
        self.base_bytes = 0
        self.vm_bytes = 0
        self.warm_state = None
        self.base_ns = []  # (fd, kind) of the slot's IPC and mount namespaces

    def setup(self):
        cfg = self.cfg
        isolation.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() == 1:
            os._exit(1)
        try:
            for p in cfg.get("cg_procs") or []:
                _write(p, "0")
        except OSError:  # v2, a slot started again: its controllers were enabled by the previous fork
            for p, value in cfg.get("cg_enable") or []:  # server (gone: its cgroups are empty); undo, join
                _write(p, value.replace("+", "-"))
            for p in cfg.get("cg_procs") or []:
                _write(p, "0")
        if self.isolate:
            self.base_ns = isolation.enter_slot(cfg, self._run_cgroup)
        else:
            self._run_cgroup()
        os.environ.clear()
        os.environ.update(cfg["env"])
        for mod in cfg.get("preload") or []:
            try:
                __import__(mod)
            except Exception:  # noqa: BLE001 - a missing optional module is no reason to fail
                pass
        self.warm_state = program.WarmState(cfg["env"], self.cg_run_fds)
        self.warm_state.install_streams()

    def _run_cgroup(self):
        """Out of the run's cgroup (inside our own cgroup namespace, before the pivot hides the
        cgroup files): we and the init stay in the slot's, each program joins the run's, whose
        memory limit the init sets; so what a run does to its memory cannot reach its supervisors."""
        cfg = self.cfg
        for p in cfg.get("cg_sup_procs") or []:
            _write(p, "0")
        for p, value in cfg.get("cg_enable") or []:
            _write(p, value)
        flags = os.O_CLOEXEC
        self.cg_limit_fds = [os.open(p, os.O_RDWR | flags) for p in cfg.get("cg_limits") or []]
        self.cg_oom_fds = [os.open(p, os.O_RDONLY | flags) for p in cfg.get("cg_oom") or []]
        self.cg_usage_fds = [os.open(p, os.O_RDONLY | flags) for p in cfg.get("cg_usage") or []]
        self.cg_run_fds[:] = [os.open(p, os.O_WRONLY | flags) for p in cfg.get("cg_run_procs") or []]

    def serve(self):
        """Start the slot's init, then fork programs on its request until it is gone."""
        forker, init_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if self.isolate:
            isolation.check(isolation.libc.unshare(isolation.CLONE_NEWPID), "unshare(pid)")
        gc.collect()
        isolation.libc.malloc_trim(0)  # a smaller copy to fork and tear down, every run
        gc.freeze()  # (the collector never walks the warm objects again, in here or in a program)
        pid = os.fork()
        if pid == 0:
            forker.close()
            isolation.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            try:
                run_init.RunInit(self, self.ctl, init_end, self.data).serve()
            except BaseException as e:  # noqa: BLE001 - reported to the server, which says why
                _report_failure(self.ctl, e)
            os._exit(2)
        self.ctl.close()  # the init's now: their EOF (the server gone) ends the init, and so us
        self.data.close()
        init_end.close()
        try:  # our address space (the init, a copy of us, measures it: our /proc is its namespace's)
            self.vm_bytes = json.loads(forker.recv(4096))["vm_bytes"]
        except (OSError, ValueError, KeyError):
            os._exit(0)
        # once, inherited by every program: no per-run cost (we never exec: for us it changes nothing)
        isolation.check(isolation.libc.prctl(isolation.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        if self.seccomp is not None:
            self.seccomp.install()
        lim = self.cfg.get("limits")
        if lim:  # (after the init's fork: the init keeps its own)
            self.warm_state.preset(lim["max_processes"], lim["max_file_mb"], lim["max_open_files"])
        self._loop(forker)

    def _loop(self, forker):
        """Fork each program on the init's request. Lean on purpose: each page this process writes
        while a program lives is copied for it, and each page a program writes that this process
        wrote is copied for the program; so its work (decoding the request, entering and leaving
        the run's namespaces) happens while no program is alive, and none between fork and wait."""
        isolate, warm, vm_bytes, start = self.isolate, self.warm_state, self.vm_bytes, program.start
        fork, close, wait4, unpack_from, loads = os.fork, os.close, os.wait4, struct.unpack_from, json.loads
        setns, check = isolation.libc.setns, isolation.check
        NEWIPC, NEWNS = isolation.CLONE_NEWIPC, isolation.CLONE_NEWNS
        (base_ipc, _), (base_mnt, _) = self.base_ns if isolate else ((-1, 0), (-1, 0))
        recvmsg, send = forker.recvmsg, forker.send
        anc_space = socket.CMSG_SPACE(6 * 4)  # (stdin, stdout, stderr, 2 namespaces, a long request)
        SOL_SOCKET, SCM_RIGHTS = socket.SOL_SOCKET, socket.SCM_RIGHTS
        while True:
            try:
                msg, anc, _, _ = recvmsg(65536, anc_space)
            except OSError:
                msg, anc = b"", []
            if not msg:
                os._exit(0)
            fds = []
            for level, kind, data in anc:
                if level == SOL_SOCKET and kind == SCM_RIGHTS:
                    fds += unpack_from("%di" % (len(data) // 4), data)
            req = loads(msg)
            if req.get("in_memfd"):  # (a long command or environment: `run_init.FORK_MSG_MAX`)
                big = fds.pop()
                req = loads(os.pread(big, os.fstat(big).st_size, 0))
                close(big)
            seq = req["seq"]
            warm.prepare(req)
            if isolate:  # the program is forked inside the run's namespaces (the init made them)
                check(setns(fds[3], NEWIPC), "setns(ipc)")
                check(setns(fds[4], NEWNS), "setns(mnt)")
            try:
                child = fork()
            except OSError as e:
                child = None
                try:
                    send(json.dumps({"seq": seq, "error": "fork: %s" % e.strerror}).encode())
                except OSError:
                    os._exit(0)
            if child == 0:  # (the control socket is closed with every other fd by `program.start`)
                start(req, fds, vm_bytes, warm)
            for fd in fds:
                close(fd)
            if child is not None:
                try:
                    if not isolate:  # (with isolation the init kills the run's namespace, not a group)
                        send(b'{"seq": %d, "pid": %d}' % (seq, child))
                    _, wstatus, ru = wait4(child, 0)
                    send(b'{"seq": %d, "exit": %d, "cpu": %r}' % (seq, wstatus, ru.ru_utime + ru.ru_stime))
                except OSError:
                    os._exit(0)  # the init is gone
            if isolate:  # (after the news: the init is waiting for it)
                check(setns(base_ipc, NEWIPC), "setns back")
                check(setns(base_mnt, NEWNS), "setns back")


def _write(path, value):
    with open(path, "w") as f:
        f.write(value)


def _report_failure(ctl, e):
    import traceback

    where = traceback.extract_tb(e.__traceback__)[-1]
    try:
        ctl.sendmsg(
            [
                json.dumps(
                    {
                        "ready": False,
                        "error": "%s: %s (%s line %d)"
                        % (type(e).__name__, e, os.path.basename(where.filename), where.lineno),
                    }
                ).encode()
            ]
        )
    except OSError:
        pass


def main():
    ctl = socket.socket(fileno=int(sys.argv[1]))
    data = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=int(sys.argv[2]))
    cfg = json.loads(ctl.recv(1 << 20))
    global isolation, program, run_init
    isolation, program, run_init = _load_siblings(cfg.pop("sources"))
    zygote = Zygote(cfg, ctl, data)
    try:
        zygote.setup()
    except BaseException as e:  # noqa: BLE001
        _report_failure(ctl, e)
        os._exit(2)
    zygote.serve()


if __name__ == "__main__":
    main()
