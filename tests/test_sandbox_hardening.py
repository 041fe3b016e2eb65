"""Red-team cases of the sandbox (issue 14), one test each, against one shared server."""

from __future__ import annotations

import base64
import concurrent.futures
import glob
import os
import random
import signal

import pytest
import requests

from slime.testing.until import until
from tests.test_sandbox import _isolation_ok, _processes_of_uids

pytestmark = pytest.mark.skipif(not _isolation_ok(), reason="namespaces/uid switching unavailable here")
UID_BASE = 62000 + 8 * random.randrange(500)  # not shared with a concurrently running sandbox
DISK_MB = 48


@pytest.fixture(scope="module")
def url():
    from slime.sandbox.server import start_local_sandbox

    u, handle = start_local_sandbox(
        max_concurrency=4,
        max_queue=64,
        extra_args=[
            "--uid-base",
            str(UID_BASE),
            "--max-output-bytes",
            "65536",
            "--max-processes",
            "32",
            "--disk-mb",
            str(DISK_MB),
            "--max-body-mb",
            "4",
            "--max-fetch-mb",
            "3",
        ],
    )
    yield u
    handle.stop()


def run(url: str, code: str, language: str = "python", **kw) -> dict:
    r = requests.post(f"{url}/run_code", json={"code": code, "language": language, **kw}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


_uid_procs = _processes_of_uids


# 1. memory is bounded for the run as a whole, not per process
def test_memory_across_children(url):
    code = (
        "import os\nkids = []\nfor i in range(6):\n    pid = os.fork()\n    if pid == 0:\n"
        "        x = bytearray(b'x') * (60 << 20)\n        import time; time.sleep(1.5)\n        os._exit(0)\n"
        "    kids.append(pid)\nok = sum(os.waitpid(p, 0)[1] == 0 for p in kids)\nprint('ok', ok)"
    )
    r = run(url, code, memory_limit_MB=128, run_timeout=20)
    assert r["run_result"]["stdout"].startswith("ok ") and int(r["run_result"]["stdout"].split()[1]) < 6, r
    assert "memory limit exceeded" in r["message"], r


# 2. disk is bounded for the run as a whole (a tmpfs of --disk-mb), not per file
def test_disk_across_files(url):
    code = (
        "written = 0\nfor i in range(20):\n    try:\n        with open(f'f{i}', 'wb') as f:\n"
        "            f.write(b'x' * (8 << 20))\n        written += 8\n    except OSError as e:\n"
        "        print('stopped', e.strerror)\n        break\nprint('MB', written)"
    )
    r = run(url, code)
    out = r["run_result"]["stdout"]
    assert "stopped No space left on device" in out, r
    assert int(out.split("MB ")[1]) <= DISK_MB


# 3. loopback is up inside the run (and there is still no route out)
def test_loopback_server_inside_the_run(url):
    code = (
        "import socket, threading\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
        "def serve():\n    c, _ = s.accept(); c.sendall(c.recv(10).upper()); c.close()\n"
        "threading.Thread(target=serve).start()\n"
        "c = socket.create_connection(s.getsockname(), timeout=5); c.sendall(b'ping'); print(c.recv(10).decode())\n"
        "try:\n    socket.create_connection(('10.1.2.3', 80), timeout=3)\nexcept OSError as e:\n"
        "    print('out:', e.strerror)"
    )
    r = run(url, code)
    assert r["run_result"]["stdout"] == "PING\nout: Network is unreachable\n", r


# 4. the program is an ordinary process: signals it sends itself work as outside
@pytest.mark.parametrize(
    "lang,code,rc",
    [
        ("python", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\nprint('alive')", -9),
        ("python", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\nprint('alive')", -11),
        ("bash", "kill -TERM $$\necho alive", -15),
    ],
)
def test_self_signal(url, lang, code, rc):
    r = run(url, code, lang)
    assert r["status"] == "Failed" and r["run_result"]["return_code"] == rc and "alive" not in r["run_result"]["stdout"]


# 5. abort() is SIGABRT (-6), in Python and in C
def test_abort(url):
    assert run(url, "import os\nos.abort()")["run_result"]["return_code"] == -6
    r = run(url, "#include <stdlib.h>\nint main(){abort();}", "c")
    if r["status"] == "SandboxError" or (r.get("compile_result") or {}).get("return_code"):
        pytest.skip("no C compiler")
    assert r["run_result"]["return_code"] == -6, r


# 6. output printed before a timeout is kept (Python unbuffered, also a python3 started by bash)
def test_output_kept_on_timeout(url):
    r = run(url, "import time\nprint('before')\ntime.sleep(30)", run_timeout=1)
    assert r["run_result"]["status"] == "TimeLimitExceeded" and r["run_result"]["stdout"] == "before\n", r
    r = run(url, "python3 -c \"print('from-child'); import time; time.sleep(30)\"", "bash", run_timeout=1)
    assert r["run_result"]["stdout"] == "from-child\n", r
    assert r["run_result"]["stderr"] == ""  # nothing of the sandbox's own in the program's streams


# 7. a stderr flood is cut at the limit and the request returns without waiting for the timeout
def test_stderr_flood_returns_promptly(url):
    r = run(url, "yes err >&2", "bash", run_timeout=60)
    rr = r["run_result"]
    assert rr["status"] == "Error" and len(rr["stderr"]) == 65536 and "output limit exceeded on stderr" in r["message"]


# 8. tiny memory limits are validated, the smallest allowed still runs the program
def test_small_memory_limit(url):
    r = run(url, "print(1)", memory_limit_MB=32)
    assert r["status"] == "Success" and r["run_result"]["stderr"] == "", r


# 9. host data is invisible; no user namespaces, no mounts for the run's code
def test_host_data_invisible(url):
    code = (
        "import os, ctypes\nprint(sorted(os.listdir('/')))\nprint(sorted(os.listdir('/etc')))\n"
        "print([p for p in ('/work', '/home', '/opt', '/root', '/etc/shadow', '/etc/hostname.orig', '/sys')"
        " if os.path.exists(p)])\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000), ctypes.get_errno())\nprint(os.path.exists('/proc/1/cmdline'))"
    )
    out = run(url, code)["run_result"]["stdout"].splitlines()
    assert out[0] == str(sorted(["bin", "dev", "etc", "lib", "lib64", "mnt", "proc", "sbin", "tmp", "usr"])) or set(
        eval(out[0])
    ) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "mnt", "proc", "sbin", "tmp", "usr"}
    assert set(eval(out[1])) <= {
        "passwd",
        "group",
        "hosts",
        "hostname",
        "nsswitch.conf",
        "localtime",
        "ld.so.cache",
        "alternatives",
    }
    assert out[2] == "[]" and out[3] == "-1 1" and out[4] == "False", out  # EPERM; the init is hidden
    r = run(
        url, "echo x > /usr/pwned; echo y > /etc/pwned; mount -t tmpfs none /tmp 2>&1 | head -c 0; echo done", "bash"
    )
    assert "done" in r["run_result"]["stdout"] and not os.path.exists("/usr/pwned")


# 10. request validation: 422 naming the field, 413 for a large body
@pytest.mark.parametrize(
    "body,field",
    [
        ({"code": "x", "run_timeout": "abc"}, "run_timeout"),
        ({"code": "x", "files": "abc"}, "files"),
        ({"code": "x", "language": "cobol"}, "language"),
        ({"code": "x", "run_timeout": 1e6}, "run_timeout"),
        ({"code": "x", "memory_limit_MB": 1}, "memory_limit_MB"),
        ({"code": 3}, "code"),
        ({"code": "x", "files": {"../x": ""}}, "files"),
    ],
)
def test_request_validation(url, body, field):
    r = requests.post(f"{url}/run_code", json=body, timeout=30)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:2] == ["body", field] and field in r.json()["message"]


def test_body_size_limit(url):
    r = requests.post(f"{url}/run_code", json={"code": "x" * (5 << 20)}, timeout=30)
    assert r.status_code == 413 and "larger than" in r.json()["message"]
    assert requests.get(f"{url}/v1/ping", timeout=10).text == "pong"


# 11. fetch_files: one resolved file is sent once, whatever its aliases; the total is capped
def test_fetch_files_aliases_and_cap(url):
    code = (
        "import os\nopen('out.bin', 'wb').write(b'a' * (1 << 20))\nos.symlink('out.bin', 'link')\n"
        "os.mkdir('d')\nopen('big1', 'wb').write(b'b' * (1536 << 10))\n"
        "open('big2', 'wb').write(b'c' * (1536 << 10))"
    )
    r = run(
        url,
        code,
        fetch_files=[
            "out.bin",
            "./out.bin",
            "/tmp/out.bin",
            "d/../out.bin",
            "link",
            "big1",
            "big2",
            "../../etc/passwd",
            "/etc/passwd",
        ],
    )
    assert list(r["files"]) == ["out.bin", "big1"], list(r["files"])  # big2 would exceed --max-fetch-mb 3
    assert base64.b64decode(r["files"]["out.bin"]) == b"a" * (1 << 20)


# 12. a request with a very long file list is handled off the event loop: /v1/ping answers meanwhile
def test_large_file_list_does_not_block_ping(url):
    files = {f"d{i % 50}/f{i}.txt": "" for i in range(40000)}  # (empty: 40,000 pages would not fit the tmpfs)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(
            requests.post,
            f"{url}/run_code",
            timeout=120,
            json={"code": "import os\nprint(sum(len(os.listdir(f'd{i}')) for i in range(50)))", "files": files},
        )
        pings_during = 0
        while not fut.done():
            if requests.get(f"{url}/v1/ping", timeout=30).text == "pong" and not fut.done():
                pings_during += 1
        r = fut.result()
    assert r.status_code == 200 and r.json()["run_result"]["stdout"] == "40000\n", r.text[:500]
    assert pings_during >= 1


# no namespace can be joined or made from a run (setns fails for want of CAP_SYS_ADMIN, unshare by seccomp)
def test_namespaces_cannot_be_joined_or_made(url):
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nout = []\n"
        "for ns in ('mnt', 'net', 'pid', 'ipc', 'uts', 'cgroup'):\n"
        "    fd = os.open('/proc/self/ns/' + ns, os.O_RDONLY)\n"
        "    out.append((libc.setns(fd, 0), ctypes.get_errno()))\n"
        "out.append((libc.unshare(0x10000000), ctypes.get_errno()))\nprint(out)"
    )
    r = run(url, code)
    assert r["run_result"]["stdout"] == str([(-1, 1)] * 7) + "\n", r


# the run's limits are cgroup limits here: v2 where the host offers it (memory, pids), else v1
def test_health_names_the_cgroups_in_use(url):
    from slime.sandbox.cgroups import CgroupHost
    from tests.test_sandbox_cgroups import REAL_V2_MISSING

    h = requests.get(f"{url}/health", timeout=10).json()
    v1_memory = any(f == "cgroup" and "memory" in opts for f, _, opts in CgroupHost.current().mounts)
    assert h["cgroups"] == ("v2" if not REAL_V2_MISSING else "v1" if v1_memory else None), h
    if h["cgroups"]:
        assert "memory" not in h["per_process_only"] and "processes" not in h["per_process_only"], h


# 13. killing the server with SIGKILL leaves no process and no files of its runs
def test_server_sigkill_leaves_nothing():
    from slime.sandbox.server import start_local_sandbox

    base = UID_BASE + 4
    before = set(glob.glob("/tmp/*"))
    u, handle = start_local_sandbox(max_concurrency=2, extra_args=["--uid-base", str(base)])
    code = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    open('/tmp/alive', 'w').write('x')\n"
        "    time.sleep(300)\nopen('/tmp/big', 'wb').write(b'x' * (8 << 20))\ntime.sleep(300)"
    )
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        futs = [
            ex.submit(requests.post, f"{u}/run_code", json={"code": code, "run_timeout": 100}, timeout=120)
            for _ in range(2)
        ]
        assert until(lambda: len(_uid_procs([base, base + 1])) >= 4), "the runs did not start"
        server_kids = _children(handle.pid)
        server_kids += [g for k in server_kids for g in _children(k)]
        os.kill(handle.pid, signal.SIGKILL)
        handle.proc.wait()
        for f in futs:
            with pytest.raises(requests.RequestException):
                f.result()
    assert until(lambda: not _uid_procs([base, base + 1])), "a run's process outlived the server"
    assert until(lambda: not [p for p in server_kids if os.path.exists(f"/proc/{p}")]), "a fork server survived"
    assert not set(glob.glob("/tmp/*")) - before - {p for p in glob.glob("/tmp/*") if not _ours(p)}


def _ours(path: str) -> bool:
    return os.path.basename(path).startswith(("slime-sandbox-", "alive", "big"))


def _children(pid: int) -> list[int]:
    out = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(f"{d}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.rsplit("/", 1)[1]))
        except (OSError, ValueError, IndexError):
            pass
    return out
