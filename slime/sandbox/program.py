"""The program's own process: what happens between the fork server's fork and the user's code.

Why a separate step: this process is forked from the warm fork server (so Python code runs without
an interpreter start) and must drop everything it inherited before untrusted code runs. It starts
in the run's mount and IPC namespaces (the init prepared them: its tmpfs is ``/tmp``), with
``no_new_privs``, the seccomp filter, the run-independent rlimits (processes, file size, open
files, no core), umask and an empty group list (all set once on the fork server: `WarmState.preset`)
and, for Python, its ``__main__`` and ``sys.argv`` in place (`WarmState.prepare`). In order: take
the run's pipes as 0/1/2 and close every other fd, the run's rlimits (CPU, address space), the
slot's uid; then exec the language's tool, or run a Python script in this already loaded
interpreter as ``python3 -u main.py`` would. stdlib only.

Each page this process writes costs a copy-on-write fault, so it does as little as it can: what
is the same for every run is done once on the fork server, what the fork server can prepare
before the fork it prepares."""

import _io
import atexit
import builtins
import gc
import io
import os
import resource
import signal
import sys
import types


# handlers a Python process starts with (the fork server's): an exec'd tool gets the defaults back
_PYTHON_SIGNALS = (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ)


class WarmState:
    """What the fork server prepares once for every Python run: its environment and the three
    text streams (built here, not after each fork: building them costs a run more than its
    ``print(1)``). The streams are built on a pipe (stdout, stderr) and on ``/dev/null`` (stdin),
    so they are what a run's pipes and stdin (a memfd, or ``/dev/null``) would have given."""

    def __init__(self, env, cg_run_fds=()):
        self.env = dict(env)
        self.cg_run_fds = cg_run_fds  # cgroup.procs of the run's cgroup: a program joins it first
        saved = [os.dup(fd) for fd in (0, 1, 2)]
        r, w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            os.dup2(null, 0)
            os.dup2(w, 1)
            os.dup2(w, 2)
            self.stdin = io.TextIOWrapper(
                io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8", errors="surrogateescape"
            )
            self.stdout = io.TextIOWrapper(
                io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="surrogateescape", write_through=True
            )
            self.stderr = io.TextIOWrapper(
                io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
            )
            for f in (self.stdin, self.stdout, self.stderr):
                f.seekable()  # (asked and cached now: a pipe is not seekable)
        finally:
            for fd, old in zip((0, 1, 2), saved):
                os.dup2(old, fd)
                os.close(old)
            for fd in (r, w, null):
                os.close(fd)
        self.main = self.path = None  # the next Python step's __main__ and script (`prepare`)
        self.limits = {}  # rlimit -> value already set on the fork server (inherited by every program)
        self.umask = None
        self.no_groups = False

    def install_streams(self):
        """Make the warm streams ``sys.std*`` of the fork server itself (on its own fds 0/1/2: same
        files as before), so that a program finds them in place and writes no ``sys`` attribute."""
        sys.stdin = sys.__stdin__ = self.stdin
        sys.stdout = sys.__stdout__ = self.stdout
        sys.stderr = sys.__stderr__ = self.stderr

    def prepare(self, req):
        """Called by the fork server just before it forks a step (no program alive then: the pages
        this writes are its own, not copied): for a Python step, the run's fresh ``__main__`` module
        and ``sys.argv``, in place for the program, which then has less to build after the fork."""
        self.main = self.path = None
        step = req["step"]
        if not step.get("warm_python"):
            return
        self.path = path = os.path.join(req["work"], step["argv"][-1])
        name = os.path.basename(path)
        self.main = main = types.ModuleType("__main__")
        main.__dict__.update({"__file__": path, "__builtins__": builtins, "__cached__": None})
        sys.modules["__main__"] = main
        sys.argv = [name]
        sys.orig_argv = [sys.executable, name]

    def preset(self, max_processes, max_file_mb, max_open_files):
        """Set the limits that are the same for every run once, on the fork server (after its init
        is started: the init keeps its own), instead of in every program: each call a program
        makes costs it copy-on-write faults. A request asking other values still gets them
        (`_start` sets what differs). Only with isolation: the fork server is root then, so
        ``RLIMIT_NPROC`` does not bind its own forks (it would for an ordinary user's)."""
        fs = max_file_mb << 20
        for lim, v in (
            (resource.RLIMIT_NPROC, max_processes),
            (resource.RLIMIT_FSIZE, fs),
            (resource.RLIMIT_NOFILE, max_open_files),
            (resource.RLIMIT_CORE, 0),
        ):
            resource.setrlimit(lim, (v, v))
            self.limits[lim] = v
        os.umask(0o022)
        self.umask = 0o022
        if os.geteuid() == 0:
            os.setgroups([])
            self.no_groups = True


def start(req, fds, vm_bytes, warm_state):
    """Become the run's program (never returns). `fds`: its stdin, stdout and stderr (then the
    run's namespaces, which the fork server joined before forking). It has ``no_new_privs`` and the
    seccomp filter already (the fork server's)."""
    try:
        os._exit(_start(req, fds, vm_bytes, warm_state))
    finally:
        os._exit(127)


def _start(req, fds, vm_bytes, warm):
    step, uid = req["step"], req["uid"]
    for fd in warm.cg_run_fds:  # first: every page this process touches from here on is the run's
        try:
            os.write(fd, b"0")
        except OSError as e:
            os.write(fds[2], ("sandbox: cannot join the run's cgroup: %s\n" % e.strerror).encode())
            return 125
    os.setsid()
    dup2 = os.dup2
    dup2(fds[0], 0)
    dup2(fds[1], 1)
    dup2(fds[2], 2)
    os.closerange(3, 1 << 16)
    is_warm = step.get("warm_python")
    if not is_warm:
        for s in _PYTHON_SIGNALS:
            signal.signal(s, signal.SIG_DFL)
    try:  # the program's processes go first when the run hits its memory limit (never the init)
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        os.write(fd, b"1000")
        os.close(fd)
    except OSError:
        pass
    setrlimit = resource.setrlimit
    cpu = step["cpu_s"]
    setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    if step.get("rlimit_as"):  # only without a memory cgroup: address space is not memory (thread stacks)
        mem = step["mem_mb"] << 20
        if is_warm:  # the loaded interpreter's own address space comes on top
            mem += vm_bytes
        setrlimit(resource.RLIMIT_AS, (mem, mem))
    preset = warm.limits
    for lim, v in (
        (resource.RLIMIT_NPROC, req["max_processes"]),
        (resource.RLIMIT_FSIZE, req["max_file_mb"] << 20),
        (resource.RLIMIT_NOFILE, req["max_open_files"]),
        (resource.RLIMIT_CORE, 0),
    ):
        if preset.get(lim) != v:  # (else the fork server's, inherited)
            setrlimit(lim, (v, v))
    if warm.umask != 0o022:
        os.umask(0o022)
    os.chdir(req["work"])
    if os.geteuid() == 0:
        if not warm.no_groups:
            os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    env = req.get("env")
    if env is None:  # (the warm one: the init sends none when they are equal)
        env = warm.env
    if is_warm:
        return _run_python(warm.path, env, warm)
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
    return 127


def _run_python(path, env, warm):
    """Run a script in this (already warm) interpreter as `python3 -u <script>` would."""
    if env is not warm.env and env != warm.env:
        os.environ.clear()
        os.environ.update(env)
    if (
        sys.stdin is not warm.stdin
        or sys.stdout is not warm.stdout
        or sys.stderr is not warm.stderr
        or sys.__stdin__ is not warm.stdin
        or sys.__stdout__ is not warm.stdout
        or sys.__stderr__ is not warm.stderr
    ):
        warm.install_streams()  # (the fork server installs them once: normally nothing to do)
    gc.freeze()  # (what the fork server made since its own freeze: a collection here never walks it)
    main = warm.main  # (with sys.argv and sys.modules["__main__"]: the fork server's `prepare`)
    sys.path.insert(0, os.path.dirname(path))
    n_names, n_modules = len(main.__dict__), len(sys.modules)  # (what the script adds: `_finalize`)
    code = 0
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            src = os.read(fd, 1 << 16)
            if len(src) == 1 << 16:  # (a larger script)
                parts = [src]
                while parts[-1]:
                    parts.append(os.read(fd, 1 << 20))
                src = b"".join(parts)
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
    code = _finalize(code, main, n_names, n_modules)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _exit_code(e):
    c = e.code
    if c is None:
        return 0
    if isinstance(c, int):  # as CPython: a C long's low byte; one that does not fit a C long gives 255
        return c & 0xFF if -(1 << 63) <= c < (1 << 63) else 255
    try:
        sys.stderr.write(str(c) + "\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


def _finalize(code, main, n_names, n_modules):
    """The interpreter's exit, minus the warm interpreter's teardown: threads joined, atexit
    handlers, then the script's own objects go as at a normal exit (its ``__main__`` cleared, the
    garbage collected: ``__del__`` methods, generators' ``finally``, and files it left open are
    flushed and closed), and any file still open elsewhere is flushed. Only the script's objects are
    walked: the fork server froze its own (`gc.freeze`), so a collection never touches them. A
    script that bound no name and imported nothing (``print(1)``) holds nothing: it skips this."""
    th = sys.modules.get("threading")
    try:
        if th is not None:
            th._shutdown()
    except BaseException:  # noqa: BLE001
        pass
    try:  # (imported with this module: an import statement here would cost the run faults)
        atexit._run_exitfuncs()
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:  # noqa: BLE001
        pass
    if not _flush_std() and code >= 0:  # (as CPython: a failed flush at exit is status 120, whatever the code)
        code = 120
    if len(main.__dict__) == n_names and len(sys.modules) == n_modules:
        return code
    _clear_main(main)
    try:
        gc.collect(2 if gc.get_objects(2) else 1)  # (the same collection; a full one also empties
        _flush_open_files()  # the free lists, whose pages are the fork server's)
    except BaseException:  # noqa: BLE001
        pass
    if not _flush_std() and code >= 0:
        code = 120
    return code


def _flush_std():
    """As CPython's exit flushes ``sys.stdout`` and ``sys.stderr``: one that is None or closed is
    skipped (a script may close its stdout: still exit status 0); False if a flush failed."""
    ok = True
    for s in (sys.stdout, sys.stderr):
        try:
            if s is None or getattr(s, "closed", False):
                continue
            s.flush()
        except BaseException:  # noqa: BLE001
            ok = False
    return ok


def _clear_main(main):
    """As the interpreter clears a module at exit: names starting with one underscore first, then
    the others, ``__builtins__`` last (kept: a ``__del__`` may still need it)."""
    d = main.__dict__
    try:
        for first in (True, False):
            for k in list(d):
                if (
                    k != "__builtins__"
                    and isinstance(k, str)
                    and (k.startswith("_") and not k.startswith("__")) is first
                ):
                    d[k] = None
    except BaseException:  # noqa: BLE001 - a __del__ raising is reported by the interpreter itself
        pass


def _flush_open_files():
    """Flush what the script still holds open after the collection (its text layers first: they
    flush into their buffers). Each object is one the script made: the fork server's are frozen."""
    layers = ([], [])
    for o in gc.get_objects():
        if isinstance(o, _io._IOBase):  # (the C bases: the `io` ABCs' checks would touch their caches)
            layers[not isinstance(o, _io._TextIOBase)].append(o)
    for f in layers[0] + layers[1]:
        try:
            if not f.closed and f.writable():
                f.flush()
        except Exception as e:  # noqa: BLE001 - as the interpreter reports a failed close at exit
            try:
                sys.stderr.write("Exception ignored in: %r\n%s: %s\n" % (f, type(e).__name__, e))
            except Exception:  # noqa: BLE001
                pass
