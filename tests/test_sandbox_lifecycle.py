"""Issue 21, the server around the runs: its own uid range, bodies admitted before they are read and
bounded, a disconnect cancelling its run, the lifeline and a second SIGTERM ending runs at once."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import signal
import socket
import threading
from pathlib import Path

import pytest
import requests

from slime.sandbox.uids import UidRange, UidRangeBusy
from slime.testing.until import until
from tests.test_sandbox import _isolation_ok, _processes_of_uids

needs_isolation = pytest.mark.skipif(not _isolation_ok(), reason="namespaces/uid switching unavailable here")
SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(100)"


def _start(**kw):
    from slime.sandbox.server import start_local_sandbox

    extra = kw.pop("extra_args", [])
    return start_local_sandbox(extra_args=extra, allow_no_isolation=True, **kw)  # (isolated where it can be)


def _uids(url: str) -> list[int]:
    lo, hi = requests.get(f"{url}/health", timeout=10).json()["uids"]
    return list(range(lo, hi + 1))


def _raw_post(url: str, body: bytes, send: int | None = None, length: int | None = None) -> socket.socket:
    """A POST /run_code whose first `send` bytes of `body` are sent (all by default)."""
    host, port = url.split("//", 1)[1].split(":")
    s = socket.create_connection((host, int(port)), timeout=60)
    head = (
        f"POST /run_code HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n\r\n"
    ).encode()
    s.sendall(head + body[:send])
    return s


def _stopped(fut: concurrent.futures.Future) -> None:
    """The request of a run its server stopped: answered as such, or its connection closed."""
    try:
        r = fut.result().json()
    except requests.RequestException:
        return
    assert r["status"] == "SandboxError" and r["message"].startswith("the sandbox server stopped this run"), r


def _status_of(sock: socket.socket) -> int:
    return int(sock.recv(65536).split(b" ", 2)[1])


# 3. each server its own uid range: two servers side by side, runs holding their process quota
def test_uid_ranges_are_claimed_once_per_host(tmp_path):
    a = UidRange.claim(4, directory=str(tmp_path))
    b = UidRange.claim(4, directory=str(tmp_path))
    try:
        assert b.base >= a.last + 1 or b.last < a.base
        with pytest.raises(UidRangeBusy, match=f"uid {a.base + 2} is held by sandbox server pid {os.getpid()}"):
            UidRange.claim(2, base=a.base + 2, directory=str(tmp_path))
    finally:
        a.release()
    c = UidRange.claim(2, base=a.base + 2, directory=str(tmp_path))  # released: free again
    assert (c.base, c.last) == (a.base + 2, a.base + 3)
    b.release()
    c.release()


@needs_isolation
def test_two_servers_never_share_uids_or_their_process_quota():
    (u1, h1), (u2, h2) = (
        _start(max_concurrency=1, extra_args=["--max-processes", "16"]),
        _start(max_concurrency=1, extra_args=["--max-processes", "16"]),
    )
    try:
        uids1, uids2 = _uids(u1), _uids(u2)
        assert not set(uids1) & set(uids2)
        hold = (
            "import os, time\nfor _ in range(14):\n    if os.fork() == 0:\n        time.sleep(100)\n"
            "print('held', flush=True)\ntime.sleep(100)"
        )
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            holding = ex.submit(requests.post, f"{u1}/run_code", json={"code": hold, "run_timeout": 30}, timeout=60)
            assert until(lambda: len(_processes_of_uids(uids1)) >= 15), "the first server's run did not start"
            code = (
                "import os, time\nkids = []\nfor _ in range(10):\n    pid = os.fork()\n    if pid == 0:\n"
                "        time.sleep(0.5)\n        os._exit(0)\n    kids.append(pid)\n"
                "print(sum(os.waitpid(k, 0)[1] == 0 for k in kids))"
            )
            r = requests.post(f"{u2}/run_code", json={"code": code}, timeout=60).json()
            assert (r["status"], r["run_result"]["stdout"]) == ("Success", "10\n"), r
            h1.stop()
            _stopped(holding)
    finally:
        h1.stop()
        h2.stop()


# 4, 5. bodies admitted before they are read, bounded in time; files bounded; a disconnect cancels
@pytest.fixture(scope="module")
def small():
    url, handle = _start(max_concurrency=1, max_queue=1, extra_args=["--body-timeout", "5", "--max-bodies", "1"])
    yield url, handle
    handle.stop()


def test_too_many_files_are_refused_before_the_body_is_parsed(small):
    url, _ = small
    body = json.dumps({"code": "print(1)", "files": {f"f{i}": "" for i in range(200_000)}}).encode()
    r = requests.post(f"{url}/run_code", data=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 422 and r.json()["message"] == "invalid request: files"
    assert r.json()["detail"] == [
        {"loc": ["body", "files"], "msg": "at most 60000 files (the run's inode budget)", "type": "too_long"}
    ]


def test_a_slow_body_times_out(small):
    url, _ = small
    body = json.dumps({"code": "print(1)"}).encode()
    s = _raw_post(url, body, send=5)  # (and then nothing)
    try:
        assert _status_of(s) == 408
    finally:
        s.close()
    assert requests.post(f"{url}/run_code", json={"code": "print(1)"}, timeout=60).json()["status"] == "Success"


def _stats(url: str) -> dict:
    return requests.get(f"{url}/v1/stats", timeout=10).json()


def test_bodies_in_memory_are_bounded(small):
    url, _ = small
    slow = _raw_post(url, b'{"code": "print(1)"', length=1000)  # (the rest never comes)
    try:
        assert until(lambda: _stats(url)["bodies"] == 1)
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            fast = ex.submit(requests.post, f"{url}/run_code", json={"code": "print(2)"}, timeout=60)
            assert until(lambda: _stats(url)["reading"] == 2), "the second request was not admitted"
            st = _stats(url)  # (--max-bodies 1: the second body waits for the first one's turn to end)
            assert (st["bodies"], st["reading"], fast.done()) == (1, 2, False)
            slow.close()
            assert fast.result().json()["run_result"]["stdout"] == "2\n"
    finally:
        slow.close()


@needs_isolation
def test_a_full_queue_answers_429_before_the_body_is_read(small):
    url, _ = small
    uids = _uids(url)
    busy = _raw_post(url, json.dumps({"code": SLEEPER, "run_timeout": 30}).encode())
    queued = None
    try:
        assert until(lambda: _processes_of_uids(uids)), "the run did not start"
        queued = _raw_post(url, b'{"code": "print(1)"', length=1000)  # (the queue's one place: body pending)
        assert until(lambda: _stats(url)["reading"] == 1)
        late = _raw_post(url, b'{"code": "print(1)"', length=10 << 20)  # (most of its body never comes)
        try:
            assert _status_of(late) == 429
        finally:
            late.close()
    finally:
        if queued is not None:
            queued.close()
        busy.close()
    assert until(lambda: _stats(url)["running"] == 0)


@needs_isolation
def test_a_client_that_disconnects_cancels_its_run(small):
    url, _ = small
    uids = _uids(url)
    client = _raw_post(url, json.dumps({"code": SLEEPER, "run_timeout": 100}).encode())
    try:
        assert until(lambda: _processes_of_uids(uids)), "the run did not start"
    finally:
        client.close()
    assert until(lambda: not _processes_of_uids(uids)), "the run outlived its client"
    assert until(lambda: _stats(url)["running"] == 0)
    r = requests.post(f"{url}/run_code", json={"code": "print(3)"}, timeout=60).json()  # (the slot is free again)
    assert r["run_result"]["stdout"] == "3\n", r


# 8. the lifeline (the owner gone) ends running runs at once; a second SIGTERM ends the server
@needs_isolation
def test_the_lifeline_ends_running_runs_at_once():
    url, handle = _start(max_concurrency=1)
    uids = _uids(url)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            fut = ex.submit(requests.post, f"{url}/run_code", json={"code": SLEEPER, "run_timeout": 100}, timeout=60)
            assert until(lambda: _processes_of_uids(uids)), "the run did not start"
            os.close(handle._lifeline)  # as if the owner had been SIGKILLed
            handle._lifeline = None
            r = fut.result().json()  # (within 60 s: the run itself would sleep for 100)
        assert r["status"] == "SandboxError" and r["message"].startswith("the sandbox server stopped this run"), r
        assert handle.proc.wait(timeout=60) is not None
        assert until(lambda: not _processes_of_uids(uids)), "a run outlived the server"
    finally:
        handle.stop()


OWNER_KILLED_WITH_A_SESSION_OPEN = """
import asyncio, os, signal
from slime.agent.sandboxes.sandbox_slime import SlimeSandbox
from slime.sandbox.server import start_local_sandbox

url, handle = start_local_sandbox(max_concurrency=1, allow_no_isolation=True)
print(handle.pid, flush=True)

async def main():
    await SlimeSandbox(url).__aenter__()  # a session (and its slot) held open
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


@needs_isolation
def test_an_owner_killed_with_a_session_open_takes_the_server_with_it():
    """A SIGKILLed owner takes the reader of the server's stderr with it: the server's note on the
    signal it sends itself then fails (EPIPE), and it must stop all the same (it once stayed forever)."""
    import select
    import subprocess
    import sys

    owner = subprocess.run(
        [sys.executable, "-c", OWNER_KILLED_WITH_A_SESSION_OPEN],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])),
    )
    assert owner.returncode == -signal.SIGKILL, owner.stderr[-2000:]
    server = int(owner.stdout.split()[0])
    try:
        fd = os.pidfd_open(server)
    except ProcessLookupError:
        return  # already gone
    try:
        gone = bool(select.select([fd], [], [], 60)[0])  # (a pidfd is readable once its process has exited)
        if not gone:
            os.kill(server, signal.SIGKILL)  # (not left behind by a failing test)
        assert gone, f"the sandbox server {server} outlived its owner by 60 s"
    finally:
        os.close(fd)


@needs_isolation
def test_a_second_sigterm_ends_the_server_and_its_runs():
    url, handle = _start(max_concurrency=1)
    uids = _uids(url)
    first_seen = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record):
            if "a second signal stops them" in record.getMessage():
                first_seen.set()

    seen = Seen()
    logging.getLogger("slime.sandbox").addHandler(seen)
    logging.getLogger("slime.sandbox").setLevel(logging.INFO)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            fut = ex.submit(requests.post, f"{url}/run_code", json={"code": SLEEPER, "run_timeout": 100}, timeout=60)
            assert until(lambda: _processes_of_uids(uids)), "the run did not start"
            handle.proc.send_signal(signal.SIGTERM)
            assert first_seen.wait(30), "the server did not report the first SIGTERM"
            assert handle.alive() and _processes_of_uids(uids)  # the first one lets the run finish
            handle.proc.send_signal(signal.SIGTERM)
            assert handle.proc.wait(timeout=60) is not None
            _stopped(fut)
        assert until(lambda: not _processes_of_uids(uids)), "a run outlived the server"
    finally:
        logging.getLogger("slime.sandbox").removeHandler(seen)
        handle.stop()
