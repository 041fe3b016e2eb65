"""Issue 21, the run's limits and answers: supervisors out of the run's memory cgroup, limits that
never leak between runs, threads, CPU kills, exit codes, /mnt, fetched files, and what a slot's
modules show. One server with one slot: consecutive runs share it."""

from __future__ import annotations

import base64
import glob
import json
import os
import subprocess

import hypothesis.strategies as hs
import pytest
import requests
from hypothesis import given, settings

from slime.sandbox.runner import SandboxConfig, _find_python
from slime.sandbox.schema import check_files, count_keys
from tests.test_sandbox import _isolation_ok

needs_isolation = pytest.mark.skipif(not _isolation_ok(), reason="namespaces/uid switching unavailable here")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def server():
    from slime.sandbox.server import start_local_sandbox

    url, handle = start_local_sandbox(
        max_concurrency=1,
        allow_no_isolation=True,  # (isolated where it can be)
        extra_args=["--cpus-per-run", "2", "--max-fetch-mb", "48"],
    )
    yield url, handle
    handle.stop()


def run(url: str, code: str, language: str = "python", **kw) -> dict:
    r = requests.post(f"{url}/run_code", json={"code": code, "language": language, **kw}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _run_memory_limit(pid: int) -> int:
    """The slot's run cgroup limit as the host sees it (v1 memory or v2)."""
    paths = glob.glob(
        f"/sys/fs/cgroup/**/slime-sandbox-{pid}/slot-0/run/memory.limit_in_bytes", recursive=True
    ) or glob.glob(f"/sys/fs/cgroup/**/slime-sandbox-{pid}/slot-0/run/memory.max", recursive=True)
    with open(paths[0]) as f:
        return int(f.read())


# 1. the init and the fork server are outside the run's memory cgroup; fetched files stream back
@needs_isolation
def test_a_fetched_file_of_most_of_the_memory_limit_comes_back_whole(server):
    url, _ = server
    code = (
        "with open('out.bin', 'wb') as f:\n    for _ in range(45):\n        f.write(bytes(range(256)) * 4096)\n"
        "print('wrote')"
    )  # (45 MB on the run's tmpfs: charged to the run, within its 64 MB)
    r = run(url, code, memory_limit_MB=64, fetch_files=["out.bin"])
    assert (r["status"], r["run_result"]["stdout"], r["not_fetched"]) == ("Success", "wrote\n", {}), r["message"]
    assert base64.b64decode(r["files"]["out.bin"]) == bytes(range(256)) * (45 << 12)


@needs_isolation
def test_a_run_over_its_memory_limit_is_reported_as_such_with_its_output(server):
    url, _ = server
    code = (
        "print('before', flush=True)\nimport sys\nsys.stdout.write('x' * (512 << 10))\n"
        "for i in range(7):\n    open(f'/tmp/f{i}', 'wb').write(b'y' * (10 << 20))\nprint('after')"
    )
    r = run(url, code, memory_limit_MB=32)
    rr = r["run_result"]
    assert (r["status"], rr["status"], rr["return_code"]) == ("Failed", "Finished", -9), r["message"]
    assert (
        r["message"] == "process exited with return code -9: memory limit exceeded (32 MB for the whole run): "
        "a process was killed"
    )
    assert rr["stdout"] == "before\n" + "x" * (512 << 10)
    assert run(url, "print(1)", memory_limit_MB=32)["run_result"]["stdout"] == "1\n"  # the slot lives on


# 2. a limit is applied or the run does not start: large, then small, on the one slot
@needs_isolation
def test_a_small_limit_after_a_large_one_on_the_same_slot_holds(server):
    url, handle = server
    fill = "for i in range(4):\n    open(f'/tmp/f{i}', 'wb').write(b'x' * (50 << 20))\nprint('filled')"
    r = run(url, fill, memory_limit_MB=1024)
    assert (r["status"], r["run_result"]["stdout"]) == ("Success", "filled\n"), r["message"]
    r = run(
        url,
        "for i in range(5):\n    open(f'/tmp/g{i}', 'wb').write(b'x' * (20 << 20))\nprint('filled')",
        memory_limit_MB=32,
    )
    assert _run_memory_limit(handle.pid) == 32 << 20, r["message"]
    assert r["status"] == "Failed" and r["run_result"]["stdout"] == "", r
    assert "memory limit exceeded (32 MB" in r["message"]


# 6. threads are not bounded by address space (the cgroup bounds memory)
@needs_isolation
def test_a_default_limit_python_run_starts_64_threads(server):
    url, _ = server
    code = (
        "import threading, concurrent.futures as cf\nb = threading.Barrier(64)\n"
        "with cf.ThreadPoolExecutor(64) as ex:\n    print(sum(ex.map(lambda _: b.wait() * 0 + 1, range(64))))\n"
        "print(threading.active_count())"
    )
    r = run(url, code, run_timeout=20)
    assert (r["status"], r["run_result"]["stdout"]) == ("Success", "64\n1\n"), r


# 7. a CPU-limit kill is a timeout, for one thread or many (--cpus-per-run 2: four threads reach the
# CPU limit before the wall-clock deadline)
@needs_isolation
@pytest.mark.parametrize("threads", [1, 4])
def test_cpu_limit_kills_report_time_limit_exceeded(server, threads):
    url, _ = server
    code = (
        f"import threading\ndef spin():\n    while True: pass\nfor _ in range({threads} - 1):\n"
        "    threading.Thread(target=spin, daemon=True).start()\nspin()"
    )
    r = run(url, code, run_timeout=1.5)
    rr = r["run_result"]
    assert (r["status"], rr["status"], rr["return_code"]) == ("Failed", "TimeLimitExceeded", None), r


# 9. exit codes as CPython gives them (compared with the same interpreter run on the host)
@needs_isolation
@pytest.mark.parametrize("value", ["2**70", "-1", "256", "2**63", "-2**63", "True", "'bye'", "None"])
def test_sys_exit_codes_are_cpythons(server, value):
    url, _ = server
    code = f"import sys\nsys.exit({value})"
    host = subprocess.run([_find_python(), "-c", code], capture_output=True, text=True)
    r = run(url, code)
    assert (r["run_result"]["return_code"], r["run_result"]["stderr"]) == (host.returncode, host.stderr)


# 9. /mnt is writable, per run, on the run's own tmpfs
@needs_isolation
def test_mnt_is_writable_and_fresh_in_each_run(server):
    url, _ = server
    r = run(
        url, "open('a.txt', 'w').write('secret'); open('/mnt/b', 'w').write('sauce')", fetch_files=["a.txt", "/mnt/b"]
    )
    assert {k: base64.b64decode(v) for k, v in r["files"].items()} == {"a.txt": b"secret", "/mnt/b": b"sauce"}
    assert run(url, "import os\nprint(os.listdir('/mnt'))")["run_result"]["stdout"] == "[]\n"


# 9. requested files that are not returned are named, with the reason
@needs_isolation
def test_files_not_fetched_are_named_with_the_reason(server):
    url, _ = server
    code = (
        "import os\nos.mkdir('d')\nopen('ok', 'w').write('x')\nfor f in ('big', 'big2'):\n"
        "    open(f, 'wb').write(b'y' * (30 << 20))"
    )
    r = run(url, code, memory_limit_MB=512, fetch_files=["ok", "./ok", "missing", "d", "big", "big2", "../x"])
    assert r["status"] == "Success" and list(r["files"]) == ["ok", "big"], r["message"]
    assert r["not_fetched"] == {
        "../x": "path escapes the work dir: '../x'",
        "./ok": "same file as 'ok' (sent once)",
        "missing": "not found",
        "d": "not a regular file",
        "big2": "over the 48 MB limit of all fetched files",
    }
    assert r["message"].startswith("not fetched: '../x' (path escapes the work dir")


# 9. a file and a directory of the same name: a clear 422
def test_a_file_that_is_also_a_directory_is_a_clear_422(server):
    url, _ = server
    r = requests.post(f"{url}/run_code", json={"code": "x", "files": {"a": "", "a/b": ""}}, timeout=30)
    assert r.status_code == 422 and r.json()["message"] == "invalid request: files"
    assert "'a' is a file, and a directory of 'a/b'" in r.json()["detail"][0]["msg"]


# 9. a child killed for memory fails the run, even when the program itself exits 0
@needs_isolation
def test_a_memory_limit_kill_of_a_child_is_a_failure(server):
    url, _ = server
    code = (
        "import os\npid = os.fork()\nif pid == 0:\n    x = bytearray(100 << 20)\n    os._exit(0)\n"
        "print(os.waitpid(pid, 0)[1])"
    )
    r = run(url, code, memory_limit_MB=32)
    assert (r["status"], r["run_result"]["return_code"], r["run_result"]["stdout"]) == ("Failed", 0, "9\n"), r
    assert r["message"] == "memory limit exceeded (32 MB for the whole run): a process was killed"


# 9. nothing in a slot shows the host's checkout path
@needs_isolation
def test_the_slots_modules_do_not_show_the_hosts_checkout(server):
    url, _ = server
    code = (
        "import sys, types\nseen = [getattr(m, '__file__', None) or '' for m in list(sys.modules.values())]\n"
        "for m in list(sys.modules.values()):\n    for v in list(vars(m).values()):\n"
        "        if isinstance(v, types.FunctionType):\n            seen.append(v.__code__.co_filename)\n"
        "seen.append(open('/proc/self/cmdline').read())\nprint('\\n'.join(sorted(set(seen))))"
    )
    out = run(url, code)["run_result"]["stdout"]
    assert REPO not in out and "<slime-sandbox>/program.py" in out, out


# the key count that refuses huge file lists without parsing them: exact for any JSON document
_json = hs.recursive(
    hs.none() | hs.booleans() | hs.integers() | hs.text(max_size=8),
    lambda inner: hs.lists(inner, max_size=4) | hs.dictionaries(hs.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


def _keys(doc) -> int:
    if isinstance(doc, dict):
        return len(doc) + sum(_keys(v) for v in doc.values())
    if isinstance(doc, list):
        return sum(_keys(v) for v in doc)
    return 0


@settings(max_examples=100, deadline=None)
@given(doc=_json, indent=hs.sampled_from([None, 1]), ascii_only=hs.booleans())
def test_count_keys_is_the_documents_key_count(doc, indent, ascii_only):
    raw = json.dumps(doc, indent=indent, ensure_ascii=ascii_only).encode()
    assert count_keys(raw, 1000) == _keys(doc)
    assert count_keys(raw, 0) == min(_keys(doc), 1)  # (stops at enough + 1)


@settings(max_examples=100, deadline=None)
@given(n_files=hs.integers(0, 40), depth=hs.integers(0, 3), inodes=hs.integers(64, 200))
def test_files_within_the_inode_budget_pass_and_beyond_it_are_named(n_files, depth, inodes):
    cfg = SandboxConfig(max_inodes=inodes)
    files = {"/".join([f"d{i % 3}"] * depth + [f"f{i}"]): "" for i in range(n_files)}
    dirs = {"/".join([f"d{i % 3}"] * k) for i in range(n_files) for k in range(1, depth + 1)}
    if n_files + len(dirs) <= inodes - 64:
        check_files(files, cfg)
    else:
        with pytest.raises(ValueError, match=f"{n_files} files in {len(dirs)} directories exceed"):
            check_files(files, cfg)
