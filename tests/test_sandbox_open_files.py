"""Issue 30, item 5: the server raises its soft open-file limit to the hard one at start, and refuses a
session whose egress cap does not fit in what its open-file limit leaves (503, naming the limit and
the flags), instead of running out of descriptors on egress connects."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import sys

import pytest
import requests

from slime.sandbox.open_files import egress_connection_budget
from tests.test_sandbox import ISOLATED

needs_isolation = pytest.mark.skipif(not ISOLATED, reason="sessions need namespaces/uid switching")


@contextlib.contextmanager
def _server_with_limits(soft: int, hard: int, extra: list[str]):
    """A `slime-sandbox` started with these open-file limits (set in the child alone: a hard limit,
    once lowered, cannot be raised back here); yields (url, pid)."""
    sock = socket.create_server(("127.0.0.1", 0))
    r, w = os.pipe()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, SLIME_SANDBOX_READY_FD=str(w), PYTHONPATH=root)
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "slime.sandbox.server", "--fd", str(sock.fileno()), *extra],
        pass_fds=(sock.fileno(), w),
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
    )
    os.close(w)
    try:
        with os.fdopen(r, "rb") as ready:
            assert b"SLIME_SANDBOX_READY" in ready.readline(), "the server did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", proc.pid
    finally:
        sock.close()
        proc.terminate()
        proc.wait(60)


def _open_files_limit(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/limits") as f:
        line = next(x for x in f if x.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    return int(soft), int(hard)


@needs_isolation
def test_the_server_takes_its_hard_open_file_limit_and_refuses_a_session_whose_egress_would_not_fit():
    hard = 1400
    extra = [
        "--max-concurrency",
        "4",
        "--max-connections",
        "64",
        "--egress",
        "t=127.0.0.1:9",
        "--max-egress-connections",
        "200",
    ]
    with _server_with_limits(256, hard, extra) as (url, pid):
        _sessions_within_the_budget(url, pid, hard)


def _sessions_within_the_budget(url: str, pid: int, hard: int) -> None:
    opened = []
    try:
        assert _open_files_limit(pid) == (hard, hard)
        budget = egress_connection_budget(hard, 64, 4)
        assert 400 <= budget < 600  # two sessions' caps fit, a third does not
        for _ in range(2):
            r = requests.post(f"{url}/sessions", json={"egress": "t"}, timeout=60)
            assert r.status_code == 200, r.text
            opened.append(r.json()["session_id"])
        r = requests.post(f"{url}/sessions", json={"egress": "t"}, timeout=60)
        assert r.status_code == 503 and "open-file limit" in r.json()["message"], r.text
        assert "--max-egress-connections" in r.json()["message"]
        r = requests.post(f"{url}/sessions", json={}, timeout=60)  # (without an egress: nothing to hold)
        assert r.status_code == 200, r.text
        opened.append(r.json()["session_id"])
        requests.delete(f"{url}/sessions/{opened.pop(0)}", timeout=60)  # a cap given back: room again
        r = requests.post(f"{url}/sessions", json={"egress": "t"}, timeout=60)
        assert r.status_code == 200, r.text
        opened.append(r.json()["session_id"])
    finally:
        for sid in opened:
            requests.delete(f"{url}/sessions/{sid}", timeout=60)


def test_the_budget_sets_aside_the_servers_own_descriptors():
    assert egress_connection_budget(1024, 1024, 4) == 0
    assert egress_connection_budget(20000, 1024, 8) == (20000 - 1024 - 16 * 8 - 256) // 2
