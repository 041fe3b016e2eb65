"""The program's own process: what happens between the fork server's fork and the user's code.

Why a separate step: this process is forked from the warm fork server (so Python code runs without
an interpreter start) and must drop everything it inherited before untrusted code runs. It starts
in the run's mount and IPC namespaces (the init prepared them: its tmpfs is ``/tmp``), with
``no_new_privs`` and the seccomp filter (both inherited from the fork server). In order: take the
run's pipes as 0/1/2 and close every other fd, rlimits (CPU, address space, processes, file size,
open files, no core), the slot's uid with no groups; then exec the language's tool, or run a
Python script in this already loaded interpreter as ``python3 -u main.py`` would. stdlib only.
"""

import io
import os
import resource
import signal
import sys


# handlers a Python process starts with (the fork server's): an exec'd tool gets the defaults back
_PYTHON_SIGNALS = (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ)


class WarmState:
    """What the fork server prepares once for every Python run: its environment and the three
    text streams (built here, not after each fork: building them costs a run more than its
    ``print(1)``). The streams are built on a pipe (stdout, stderr) and on ``/dev/null`` (stdin),
    so they are what a run's pipes and stdin (a memfd, or ``/dev/null``) would have given."""

    def __init__(self, env):
        self.env = dict(env)
        saved = [os.dup(fd) for fd in (0, 1, 2)]
        r, w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            os.dup2(null, 0)
            os.dup2(w, 1)
            os.dup2(w, 2)
            self.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8",
                                          errors="surrogateescape")
            self.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                           errors="surrogateescape", write_through=True)
            self.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                           errors="backslashreplace", write_through=True)
            for f in (self.stdin, self.stdout, self.stderr):
                f.seekable()  # (asked and cached now: a pipe is not seekable)
        finally:
            for fd, old in zip((0, 1, 2), saved):
                os.dup2(old, fd)
                os.close(old)
            for fd in (r, w, null):
                os.close(fd)


def start(req, fds, vm_bytes, warm_state):
    """Become the run's program (never returns). `fds`: its stdin, stdout and stderr. It is in the
    run's namespaces already, with ``no_new_privs`` and the seccomp filter (the fork server's)."""
    try:
        os._exit(_start(req, fds, vm_bytes, warm_state))
    finally:
        os._exit(127)


def _start(req, fds, vm_bytes, warm_state):
    step, uid = req["step"], req["uid"]
    os.setsid()
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
    os.closerange(3, 1 << 16)
    warm = step.get("warm_python")
    if not warm:
        for s in _PYTHON_SIGNALS:
            signal.signal(s, signal.SIG_DFL)
    try:  # the program's processes go first when the run hits its memory limit (never the init)
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        os.write(fd, b"1000")
        os.close(fd)
    except OSError:
        pass
    cpu = step["cpu_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    mem = step["mem_mb"] << 20
    if warm:  # the loaded interpreter's own address space comes on top
        mem += vm_bytes
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_NPROC, (req["max_processes"], req["max_processes"]))
    fs = req["max_file_mb"] << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (fs, fs))
    resource.setrlimit(resource.RLIMIT_NOFILE, (req["max_open_files"], req["max_open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.umask(0o022)
    os.chdir(req["work"])
    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    env = req["env"]
    if warm:
        return _run_python(os.path.join(req["work"], step["argv"][-1]), env, warm_state)
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
    import builtins
    import types

    if env != warm.env:
        os.environ.clear()
        os.environ.update(env)
    sys.stdin = sys.__stdin__ = warm.stdin
    sys.stdout = sys.__stdout__ = warm.stdout
    sys.stderr = sys.__stderr__ = warm.stderr
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
