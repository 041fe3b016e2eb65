"""The local sandbox server: SandboxFusion compatibility, limits, 429 and a hostile-code suite."""

from __future__ import annotations

import base64
import concurrent.futures
import glob
import os
import random

import pytest
import requests

from slime.sandbox.runner import IsolationUnavailable, SandboxConfig, probe_isolation

SECRET = "slime-test-secret-0f3c9a"


def _isolation_ok() -> bool:
    try:
        probe_isolation(SandboxConfig())
        return True
    except IsolationUnavailable:
        return False


ISOLATED = _isolation_ok()
UID_BASE = 66000 + 8 * random.randrange(500)  # not shared with a sandbox running concurrently
needs_isolation = pytest.mark.skipif(not ISOLATED, reason="namespaces/uid switching unavailable here")


@pytest.fixture(scope="module")
def sandbox():
    from slime.sandbox.server import start_local_sandbox

    os.environ["SLIME_TEST_SANDBOX_SECRET"] = SECRET  # the server inherits it; runs must not
    try:
        url, handle = start_local_sandbox(
            max_concurrency=4,
            max_queue=64,
            allow_no_isolation=not ISOLATED,
            extra_args=["--max-output-bytes", "65536", "--max-processes", "32", "--uid-base", str(UID_BASE)],
        )
    finally:
        os.environ.pop("SLIME_TEST_SANDBOX_SECRET", None)
    yield url, handle
    handle.stop()
    assert not handle.alive()


def run(url: str, code: str, language: str = "python", **kw) -> dict:
    r = requests.post(f"{url}/run_code", json={"code": code, "language": language, **kw}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_ping_and_stats(sandbox):
    url, _ = sandbox
    assert requests.get(f"{url}/v1/ping").text == "pong"
    st = requests.get(f"{url}/v1/stats").json()
    assert st["max_concurrency"] == 4 and st["isolation"] is ISOLATED


def test_sandbox_fusion_client(sandbox):
    url, _ = sandbox
    from sandbox_fusion import RunCodeRequest, RunStatus, run_code

    res = run_code(
        RunCodeRequest(
            code="import sys\nprint(open('data/in.txt').read().strip(), sys.stdin.read().strip())\n"
            "open('out.bin','wb').write(b'\\x00\\x01')",
            language="python",
            stdin="from-stdin",
            files={"data/in.txt": base64.b64encode(b"from-file").decode()},
            fetch_files=["out.bin", "missing.txt"],
        ),
        endpoint=url,
    )
    assert res.status == RunStatus.Success
    assert res.run_result.stdout == "from-file from-stdin\n"
    assert base64.b64decode(res.files["out.bin"]) == b"\x00\x01" and "missing.txt" not in res.files
    bad = run_code(RunCodeRequest(code="exit 3", language="bash"), endpoint=url)
    assert bad.status == RunStatus.Failed and bad.run_result.return_code == 3


def test_languages_and_timeouts(sandbox):
    url, _ = sandbox
    assert run(url, "echo $((6*7))", "bash")["run_result"]["stdout"] == "42\n"
    r = run(url, "import time\nprint('before', flush=True)\ntime.sleep(30)", run_timeout=0.5)
    assert r["status"] == "Failed" and r["run_result"]["status"] == "TimeLimitExceeded"
    assert r["run_result"]["stdout"] == "before\n" and r["run_result"]["execution_time"] < 5
    r = run(url, "int main( {", "c")
    if r["message"].startswith("language"):
        pytest.skip("no C compiler")
    assert r["status"] == "Failed" and r["compile_result"]["return_code"] != 0 and r["run_result"] is None
    r = requests.post(f"{url}/run_code", json={"code": "x", "language": "cobol"}, timeout=60)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "language"]


def test_queue_and_429(sandbox):
    from slime.sandbox.server import start_local_sandbox

    url, handle = start_local_sandbox(max_concurrency=1, max_queue=1, allow_no_isolation=not ISOLATED)
    try:

        def one(_):
            return requests.post(
                f"{url}/run_code", json={"code": "import time; time.sleep(0.4)", "language": "python"}, timeout=60
            )

        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            rs = list(ex.map(one, range(6)))
        codes = sorted(r.status_code for r in rs)
        assert codes.count(200) >= 2 and 429 in codes, codes
        r429 = next(r for r in rs if r.status_code == 429)
        assert int(r429.headers["Retry-After"]) >= 1 and r429.json()["retry_after_s"] > 0
        st = requests.get(f"{url}/v1/stats").json()
        assert st["max_running"] == 1 and st["max_queued"] <= 1 and st["rejected"] == codes.count(429)
    finally:
        handle.stop()


def test_fail_closed_without_isolation(monkeypatch, capsys):
    from slime.sandbox import server

    def nope(cfg):
        raise IsolationUnavailable("unshare: Operation not permitted")

    monkeypatch.setattr("slime.sandbox.runner.probe_isolation", nope)
    with pytest.raises(SystemExit) as e:
        server.main(["--port", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "refusing to start" in err and "--allow-no-isolation" in err
    with pytest.raises(IsolationUnavailable):
        probe_isolation(SandboxConfig(python="/nonexistent/python3"))


# ------------------------------------------------------------------------- hostile code
HOSTILE = {
    "infinite_loop": ("python", "while True: pass", {"run_timeout": 1}),
    "fork_bomb": ("bash", ":(){ :|:& };:", {"run_timeout": 2}),
    "fork_bomb_py": (
        "python",
        "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass",
        {"run_timeout": 2},
    ),
    "memory_bomb": ("python", "x = []\nwhile True: x.append(bytearray(50 << 20))", {"memory_limit_MB": 256}),
    "network": (
        "python",
        "import socket\ns = socket.create_connection(('1.1.1.1', 80), timeout=3)\nprint('CONNECTED')",
        {},
    ),
    "network_loopback": (
        "python",
        "import socket\ns = socket.create_connection(('127.0.0.1', PORT), timeout=3)\nprint('CONNECTED')",
        {},
    ),
    "huge_output": ("python", "import sys\nwhile True: sys.stdout.write('x' * 65536)", {"run_timeout": 10}),
    "write_outside": (
        "bash",
        "for d in /etc /work /root /usr /var/tmp /dev/shm /run/lock; do "
        "echo pwned > $d/slime-pwned 2>/dev/null && echo WROTE $d; done; "
        "echo hi > /tmp/slime-inside && echo tmp-ok",
        {},
    ),
    "secrets": (
        "bash",
        "env; cat /proc/1/environ /proc/$PPID/environ 2>/dev/null | tr '\\0' '\\n'; "
        "for p in /proc/[0-9]*/environ; do cat $p 2>/dev/null; done",
        {},
    ),
    "kill_parent": ("bash", "kill -9 $PPID; kill -9 -1; kill -9 1; pkill -9 -f slime 2>/dev/null; echo done", {}),
    "daemon_escape": (
        "python",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
        "    open('/tmp/alive', 'w').write('x')\n    time.sleep(60)\nprint('parent exits')",
        {},
    ),
    "big_file": ("python", "open('big', 'wb').write(b'x' * (200 << 20))", {}),
}


@needs_isolation
def test_hostile_code_suite(sandbox):
    url, handle = sandbox
    port = int(url.rsplit(":", 1)[1])
    before_tmp = set(glob.glob("/tmp/*"))
    results = {}

    def go(item):
        name, (lang, code, kw) = item
        return name, run(url, code.replace("PORT", str(port)), lang, **kw)

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        results = dict(ex.map(go, HOSTILE.items()))

    r = results["infinite_loop"]["run_result"]
    assert r["status"] == "TimeLimitExceeded" and r["execution_time"] < 5
    for k in ("fork_bomb", "fork_bomb_py"):  # (the bash bomb's script itself exits at once: bomb killed with it)
        assert results[k]["run_result"]["execution_time"] < 10, results[k]
    assert results["fork_bomb_py"]["run_result"]["status"] == "TimeLimitExceeded"
    mem = results["memory_bomb"]
    assert mem["status"] == "Failed" and mem["run_result"]["return_code"] == -9, mem  # (the cgroup's OOM kill)
    assert "memory limit exceeded (256 MB" in mem["message"], mem
    for k in ("network", "network_loopback"):
        assert "CONNECTED" not in results[k]["run_result"]["stdout"] and results[k]["status"] == "Failed", results[k]
    big = results["huge_output"]["run_result"]
    assert len(big["stdout"]) == 65536 and big["stderr"] == ""  # the sandbox's note is in the message
    assert "output limit exceeded" in results["huge_output"]["message"]
    wo = results["write_outside"]["run_result"]["stdout"]
    assert "WROTE /etc" not in wo and "WROTE /work" not in wo and "WROTE /root" not in wo and "WROTE /usr" not in wo
    assert "tmp-ok" in wo
    for p in (
        "/etc/slime-pwned",
        "/work/slime-pwned",
        "/var/tmp/slime-pwned",
        "/dev/shm/slime-pwned",
        "/run/lock/slime-pwned",
        "/tmp/slime-inside",
        "/tmp/alive",
    ):
        assert not os.path.exists(p), p
    sec = results["secrets"]["run_result"]["stdout"]
    assert SECRET not in sec and "RAY_" not in sec and "SLIME_SANDBOX_READY_FD" not in sec
    assert results["daemon_escape"]["run_result"]["stdout"] == "parent exits\n"
    assert results["big_file"]["status"] == "Failed", results["big_file"]
    # the server survived all of it, every run is gone, and nothing was left behind
    assert handle.alive()
    assert requests.get(f"{url}/v1/ping").text == "pong"
    assert run(url, "print(1)")["run_result"]["stdout"] == "1\n"
    st = requests.get(f"{url}/v1/stats").json()
    assert st["running"] == 0 and st["max_running"] <= 4
    assert not _processes_of_uids(range(UID_BASE, UID_BASE + 4)), "a sandboxed process outlived its run"
    leftovers = {p for p in set(glob.glob("/tmp/*")) - before_tmp if "slime-pwned" in p or p.endswith("alive")}
    assert not leftovers


def _processes_of_uids(uids) -> list[int]:
    uids = {str(u) for u in uids}
    out = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(f"{d}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if line.split()[1] in uids:
                            out.append(int(d.rsplit("/", 1)[1]))
                        break
        except OSError:
            pass
    return out


@needs_isolation
def test_runs_are_isolated_from_each_other(sandbox):
    url, _ = sandbox
    r = run(
        url,
        "import os\nprint(os.getuid(), os.getpid(), os.getcwd(), sorted(os.listdir('/tmp')))\n"
        "print(len([p for p in os.listdir('/proc') if p.isdigit()]))",
    )
    uid, pid, cwd, *_ = r["run_result"]["stdout"].split()
    assert UID_BASE <= int(uid) < UID_BASE + 4 and int(pid) > 1 and cwd == "/tmp"  # an ordinary process, not PID 1
    assert int(r["run_result"]["stdout"].splitlines()[1]) <= 3  # only its own pid namespace is visible


@needs_isolation
def test_each_program_gets_its_limits_identity_and_a_fresh_main(sandbox):
    """Part of a program's set-up is done once on the fork server (run-independent rlimits, umask,
    no groups, the warm streams) or by it just before the fork (``__main__``, ``sys.argv``): what the
    program sees must be exactly what it would set itself, run after run, in every slot."""
    url, _ = sandbox
    code = (
        "import os, resource as r, sys\n"
        "lim = [r.getrlimit(x) for x in (r.RLIMIT_NPROC, r.RLIMIT_FSIZE, r.RLIMIT_NOFILE, r.RLIMIT_CORE,"
        " r.RLIMIT_CPU)]\n"
        "print(lim, oct(os.umask(0o22)), os.getgroups(), os.getresuid(), os.getresgid(), sys.argv,"
        " os.path.basename(sys.orig_argv[-1]), __name__, __file__, sys.path[0], os.getcwd(),"
        " sys.stdout is sys.__stdout__, sys.stderr is sys.__stderr__, sys.stdin is sys.__stdin__,"
        " 'seen' in globals(), input())\n"
        "seen = 1\n"
    )
    outs = set()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for res in pool.map(lambda _: run(url, code, stdin="in\n", run_timeout=3), range(12)):
            assert res["status"] == "Success", res
            outs.add(res["run_result"]["stdout"])
    mb64 = 64 << 20
    expect = {
        f"[(32, 32), ({mb64}, {mb64}), (256, 256), (0, 0), (3, 4)] 0o22 [] ({u}, {u}, {u}) ({u}, {u}, {u}) "
        f"['main.py'] main.py __main__ /tmp/main.py /tmp /tmp True True True False in\n"
        for u in range(UID_BASE, UID_BASE + 4)
    }
    assert outs <= expect and len(outs) >= 1


EXIT_SCRIPT = (
    "import atexit, json\n"
    "class Noisy:\n"
    "    def __del__(self):\n"
    "        print('del ran')\n"
    "def gen():\n"
    "    try:\n"
    "        yield 1\n"
    "    finally:\n"
    "        print('generator closed')\n"
    "it = gen(); next(it)\n"
    "noisy = Noisy()\n"
    "out = open('out.txt', 'w'); out.write('main ' * 1000)\n"  # never closed: flushed at exit
    "json.stash = open('stash.txt', 'w'); json.stash.write('stashed')\n"  # held by a module: flushed too
    "atexit.register(lambda: print('atexit ran'))\n"
    "print('main')\n"
)


def test_interpreter_exit_semantics(sandbox, tmp_path):
    """What `python3 main.py` does at exit: user atexit handlers, __del__ and generator finalisers
    of the script's objects (output returned), files left open are complete."""
    url, _ = sandbox
    res = run(url, EXIT_SCRIPT, fetch_files=["out.txt", "stash.txt"])
    assert res["status"] == "Success", res
    assert res["run_result"]["stdout"] == "main\natexit ran\ngenerator closed\ndel ran\n"
    assert base64.b64decode(res["files"]["out.txt"]) == b"main " * 1000
    assert base64.b64decode(res["files"]["stash.txt"]) == b"stashed"
    assert run(url, "print(1)")["run_result"]["stdout"] == "1\n"  # (the cheap path: nothing to finalise)
