"""Issue 30, items 3-4: what a run is answered matches what a plain `python3 -c` gives (exit
statuses of `sys.exit` values, closed or failing std streams, `os._exit`, signals), a run killed by
its CPU limit is TimeLimitExceeded whatever its thread count, and no address family but AF_UNIX,
AF_INET and AF_INET6 (netlink's route protocol aside) can be opened in a run or a session."""

from __future__ import annotations

import shutil
import signal
import subprocess

import pytest
import requests

from slime.sandbox.run_init import cpu_limit_killed
from tests.test_sandbox import ISOLATED

needs_isolation = pytest.mark.skipif(not ISOLATED, reason="namespaces/uid switching unavailable here")

EXITS = [
    "import sys; sys.exit(2**70)",
    "import sys; sys.exit(-(2**70))",
    "import sys; sys.exit(-1)",
    "import sys; sys.exit(256)",
    "import sys; sys.exit(257)",
    "import sys; sys.exit(True)",
    "import sys; sys.exit(1.5)",
    "import sys; sys.exit(None)",
    "import sys; sys.exit('bye')",
    "import sys; sys.exit([1])",
    "raise SystemExit(5)",
    "raise ValueError('x')",
    "raise KeyboardInterrupt",
    "import sys; sys.stdout.close()",
    "import sys; sys.stderr.close()",
    "import sys; sys.stdout.close(); sys.exit(3)",
    "import sys; sys.stdout = None",
    "import sys; sys.stderr = None; sys.exit(4)",
    "import sys; sys.stdout = open('/dev/full', 'w'); print('x')",
    "import sys; sys.stdout = open('/dev/full', 'w'); print('x'); sys.exit(3)",
    "import sys; print('kept'); sys.stdout.flush(); sys.stdout.close()",
    "import os; os._exit(7)",
    "import os; os._exit(300)",
    "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
    "import os, signal; os.kill(os.getpid(), signal.SIGXCPU)",
    "import os; os.abort()",
    "import atexit, sys; atexit.register(sys.exit, 9)",
    "import threading, sys; t = threading.Thread(target=sys.exit, args=(3,)); t.start(); t.join(); print('on')",
]


@pytest.fixture(scope="module")
def url():
    from slime.sandbox.server import start_local_sandbox

    u, handle = start_local_sandbox(max_concurrency=2, extra_args=["--cpus-per-run", "2"])
    yield u
    handle.stop()


def _interpreter(url: str) -> str:
    """The interpreter the sandbox runs Python with (as its own `sys.executable` names it)."""
    r = requests.post(f"{url}/run_code", json={"code": "import sys; print(sys.executable)"}, timeout=60).json()
    return r["run_result"]["stdout"].strip()


@needs_isolation
def test_exit_statuses_match_a_plain_python3(url):
    python = _interpreter(url)
    differ = []
    for code in EXITS:
        plain = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
        r = requests.post(f"{url}/run_code", json={"code": code}, timeout=60).json()["run_result"]
        ours = (r["return_code"], r["stdout"], bool(r["stderr"]))
        if ours != (plain.returncode, plain.stdout, bool(plain.stderr)):
            differ.append((code, ours, (plain.returncode, plain.stdout, bool(plain.stderr))))
    assert not differ, differ


def test_the_cpu_limits_signals_are_a_time_limit_whatever_the_clock_says():
    assert cpu_limit_killed(-signal.SIGXCPU, 5.91, 6)  # (5 spinning threads: the precise clock lags the kernel's)
    assert cpu_limit_killed(-signal.SIGKILL, 7.0, 6)  # (SIGXCPU ignored: the hard limit, a second later)
    assert not cpu_limit_killed(-signal.SIGXCPU, 0.02, 6)  # (sent by the program itself)
    assert not cpu_limit_killed(-signal.SIGKILL, 0.5, 6)
    assert not cpu_limit_killed(-signal.SIGTERM, 9.0, 6) and not cpu_limit_killed(0, 9.0, 6)
    assert not cpu_limit_killed(-signal.SIGXCPU, None, 6)


SPIN_C = r"""
#include <pthread.h>
static void *spin(void *a) { volatile unsigned long n = 0; for (;;) n++; return a; }
int main(void) { pthread_t t[5]; for (int i = 0; i < 5; i++) pthread_create(&t[i], 0, spin, 0);
                 pthread_join(t[0], 0); return 0; }
"""


@needs_isolation
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("trial", range(3))
def test_a_multithreaded_program_killed_by_its_cpu_limit_is_a_time_limit(url, trial):
    r = requests.post(
        f"{url}/run_code", timeout=120, json={"code": SPIN_C, "language": "c", "run_timeout": 6, "compile_timeout": 30}
    ).json()
    assert r["run_result"]["status"] == "TimeLimitExceeded" and r["run_result"]["return_code"] is None, r


VSOCK = (
    "import socket\nfor fam, kind in ((socket.AF_VSOCK, socket.SOCK_STREAM), (socket.AF_PACKET, socket.SOCK_RAW),"
    " (socket.AF_NETLINK, socket.SOCK_RAW), (45, socket.SOCK_STREAM)):\n"
    "    proto = 4 if fam == socket.AF_NETLINK else 0\n"
    "    try:\n        socket.socket(fam, kind, proto)\n        print(fam, 'opened')\n"
    "    except OSError as e:\n        print(fam, e.strerror)\n"
    "socket.socket(socket.AF_INET6, socket.SOCK_STREAM); socket.socketpair(); print('inet6 unix')\n"
)
REFUSED = (
    f"{int(__import__('socket').AF_VSOCK)} Address family not supported by protocol\n"
    f"{int(__import__('socket').AF_PACKET)} Address family not supported by protocol\n"
    f"{int(__import__('socket').AF_NETLINK)} Protocol not supported\n"
    "45 Address family not supported by protocol\ninet6 unix\n"
)


@needs_isolation
def test_no_socket_family_but_unix_and_inet_in_a_run_or_a_session(url):
    r = requests.post(f"{url}/run_code", json={"code": VSOCK}, timeout=60).json()
    assert r["run_result"]["stdout"] == REFUSED, r
    sid = requests.post(f"{url}/sessions", json={}, timeout=60).json()["session_id"]
    try:
        out = requests.post(
            f"{url}/sessions/{sid}/exec",
            timeout=120,
            json={"command": f"python3 -c {__import__('shlex').quote(VSOCK)}"},
        ).json()
    finally:
        requests.delete(f"{url}/sessions/{sid}", timeout=60)
    assert out["stdout"] == REFUSED, out
