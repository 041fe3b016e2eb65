"""Issue 23, sandbox side: sessions (a workspace kept across commands in one slot held for the session's
life), their deadlines and limits, and the `SlimeSandbox` client with `exec_and_wait` on it."""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import io
import json
import os
import tarfile
from typing import Iterator

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.testing.until import until
from tests.test_sandbox import ISOLATED, _processes_of_uids

pytestmark = pytest.mark.skipif(not ISOLATED, reason="sessions need namespaces/uid switching")


@pytest.fixture(scope="module")
def url():
    from slime.sandbox.server import start_local_sandbox

    url, handle = start_local_sandbox(
        max_concurrency=2,
        max_queue=4,
        extra_args=["--max-output-bytes", "65536", "--max-session-disk-mb", "64", "--max-sessions", "3"],
    )
    yield url
    # nothing outlives the server: a session still running a command when it stops leaves no process
    s = _open(url)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    pool.submit(
        requests.post,
        f"{url}/sessions/{s['session_id']}/exec",
        json={"command": "sleep 100", "timeout": 300},
        timeout=300,
    )
    assert until(lambda: _processes_of_uids([s["uid"]]))
    handle.stop()
    assert until(lambda: not _processes_of_uids([s["uid"]])), "a session's process outlived the server"
    pool.shutdown()


def _open(url: str, **body) -> dict:
    r = requests.post(f"{url}/sessions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@contextlib.contextmanager
def _session(url: str, **body) -> Iterator[dict]:
    """An open session for the block (the `_open` answer), closed after it whatever happens."""
    s = _open(url, **body)
    try:
        yield s
    finally:
        _close(url, s["session_id"])


def _exec(url: str, sid: str, command: str, **kw) -> dict:
    r = requests.post(f"{url}/sessions/{sid}/exec", json={"command": command, **kw}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _close(url: str, sid: str) -> None:
    assert requests.delete(f"{url}/sessions/{sid}", timeout=60).json() == {"closed": sid}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_session_keeps_its_workspace_across_commands_as_its_own_uid(url):
    with _session(url, files={"repo/a.py": _b64(b"A = 1\n"), "/home/agent/.rc": _b64(b"rc")}) as s:
        sid, uid = s["session_id"], s["uid"]
        assert (s["workdir"], s["home"], s["egress_url"], s["memory_mb"], s["disk_mb"]) == (
            "/tmp",
            "/home/agent",
            None,
            512,
            256,
        )
        first = _exec(url, sid, "id -u; pwd; echo $HOME; cat repo/a.py /home/agent/.rc; echo made > repo/b.txt")
        assert (first["stdout"], first["returncode"]) == (f"{uid}\n/tmp\n/home/agent\nA = 1\nrc", 0)
        assert uid != 0
        second = _exec(url, sid, "cat b.txt; ls -A /tmp /home", cwd="/tmp/repo")
        assert second == {
            "status": "Finished",
            "returncode": 0,
            "stdout": "made\n/home:\nagent\nroot\n\n/tmp:\nrepo\n",
            "stderr": "",
            "execution_time": second["execution_time"],
            "cpu_time": second["cpu_time"],
            "message": "",
        }
        assert _exec(url, sid, "touch /usr/x")["stderr"] == "touch: cannot touch '/usr/x': Read-only file system\n"


def test_a_session_gets_a_writable_workspace_on_its_budget_gone_with_it_and_never_seen_by_runs(url):
    """slime's coding example writes /workspace/__cagent_patch__.diff: sessions get /workspace, a link
    to their tmpfs; both slots serve a session here, so the run after them is in a slot a session had."""
    with _session(url, disk_mb=8, files={"/workspace/seed.txt": _b64(b"seed")}) as a, _session(url):
        out = _exec(
            url,
            a["session_id"],
            "cat /workspace/seed.txt; echo; readlink /workspace; mkdir /workspace/d; "
            "echo kept > /workspace/d/f; stat -c %u /workspace/d; "
            "head -c 20000000 /dev/zero > /workspace/big; echo $?; rm /workspace/big",
        )
        assert out["stdout"] == f"seed\n/mnt/workspace\n{a['uid']}\n1\n"
        assert "No space left on device" in out["stderr"]
        assert _exec(url, a["session_id"], "cat d/f", cwd="/workspace")["stdout"] == "kept\n"
    code = "import json, os; print(json.dumps(sorted(os.listdir('/'))))"
    run = requests.post(f"{url}/run_code", json={"code": code}, timeout=120).json()
    assert run["status"] == "Success", run
    assert {"home", "workspace"}.isdisjoint(json.loads(run["run_result"]["stdout"])), run["run_result"]["stdout"]
    with _session(url) as c:
        assert _exec(url, c["session_id"], "ls -A /workspace")["stdout"] == ""


def test_exec_takes_env_stdin_and_cwd_and_answers_each_status(url):
    with _session(url, env={"BASE": "b", "OVER": "session"}) as s:
        sid = s["session_id"]
        out = _exec(
            url, sid, 'echo "$BASE $OVER $ONLY"; cat; exit 7', env={"OVER": "exec", "ONLY": "o"}, stdin="from stdin\n"
        )
        assert (out["status"], out["returncode"], out["stdout"]) == ("Finished", 7, "b exec o\nfrom stdin\n")
        slow = _exec(url, sid, "echo started; sleep 30", timeout=1)
        assert (slow["status"], slow["returncode"], slow["stdout"]) == ("TimeLimitExceeded", None, "started\n")
        assert slow["message"].startswith("time limit exceeded after 1.")
        flood = _exec(url, sid, "yes | head -c 200000")
        assert (flood["status"], len(flood["stdout"])) == ("Error", 65536)
        assert flood["message"] == "output limit exceeded on stdout (65536 bytes): the run was killed"
        missing = _exec(url, sid, "pwd", cwd="/nonexistent")
        assert (missing["returncode"], missing["stdout"]) == (1, "")
        assert _exec(url, sid, "echo still here")["stdout"] == "still here\n"  # (the session survived all that)


def test_commands_of_one_session_run_one_after_the_other(url):
    with _session(url) as s, concurrent.futures.ThreadPoolExecutor(1) as pool:
        sid, uid = s["session_id"], s["uid"]
        first = pool.submit(_exec, url, sid, "echo a >> log; sleep 1; echo b >> log")
        assert until(lambda: _processes_of_uids([uid]))  # the first one runs ...
        assert _exec(url, sid, "cat log")["stdout"] == "a\nb\n"  # ... and this one waited for its end
        assert first.result()["returncode"] == 0
        busy = pool.submit(_exec, url, sid, "sleep 3")
        assert until(lambda: _processes_of_uids([uid]))
        r = requests.post(f"{url}/sessions/{sid}/exec", json={"command": "true", "timeout": 0.5}, timeout=60)
        assert (r.status_code, r.json()["message"]) == (409, f"session {sid}: another command still ran after 0.5s")
        assert busy.result()["returncode"] == 0


def test_what_a_command_leaves_running_ends_with_it(url):
    with _session(url) as s:
        sid = s["session_id"]
        assert _exec(url, sid, "sleep 100 & setsid sleep 100 & echo spawned")["stdout"] == "spawned\n"
        assert _exec(url, sid, "ps -e -o comm= | sort")["stdout"] == "bash\nps\nsort\n"


def test_files_written_are_read_back_byte_for_byte(url):
    @settings(max_examples=12, deadline=None)
    @given(
        content=st.binary(max_size=4096),
        name=st.text(st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=20).filter(
            lambda n: n not in (".", "..")
        ),
    )
    def round_trip(content, name):
        path = f"/home/agent/d/{name}"
        r = requests.put(f"{url}/sessions/{sid}/files", json={"path": path, "content": _b64(content)}, timeout=60)
        assert r.status_code == 200, r.text
        got = requests.get(f"{url}/sessions/{sid}/files", params={"path": path}, timeout=60).json()
        assert base64.b64decode(got["content"]) == content

    with _session(url) as s:
        sid = s["session_id"]
        round_trip()


def test_reading_a_missing_or_too_large_file_is_refused_naming_it(url):
    with _session(url) as s:
        sid = s["session_id"]
        r = requests.get(f"{url}/sessions/{sid}/files", params={"path": "nope.txt"}, timeout=60)
        assert r.status_code == 404
        assert r.json()["message"] == (
            f"session {sid}: 'nope.txt' could not be read: /bin/cat: nope.txt: No such file or directory"
        )
        assert _exec(url, sid, "head -c 65537 /dev/zero > big")["returncode"] == 0
        r = requests.get(f"{url}/sessions/{sid}/files", params={"path": "big"}, timeout=60)
        assert (r.status_code, r.json()["message"]) == (
            413,
            f"session {sid}: 'big' is larger than the 65536 bytes one read returns (--max-output-bytes)",
        )


def test_a_seed_tar_is_unpacked_into_the_workspace(url):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("proj/src/m.py", b"x = 2\n"), ("proj/README", b"hi\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with _session(url, tar=_b64(buf.getvalue())) as s:
        assert (
            _exec(url, s["session_id"], "find proj -type f | sort; cat proj/src/m.py")["stdout"]
            == "proj/README\nproj/src/m.py\nx = 2\n"
        )


def test_the_session_disk_and_inode_budget_bounds_its_workspace(url):
    with _session(url, disk_mb=8, max_inodes=1024) as s:
        sid = s["session_id"]
        out = _exec(url, sid, "head -c 20000000 /dev/zero > big; echo $?; df -k --output=size /tmp | tail -1; rm big")
        assert out["stdout"].split() == ["1", "8192"]
        assert "No space left on device" in out["stderr"]
        out = _exec(url, sid, "df --output=itotal /tmp | tail -1; touch $(seq 1 1100) 2>/dev/null; echo $?; ls | wc -l")
        made = int(out["stdout"].split()[2])
        assert out["stdout"].split()[:2] == ["1024", "1"] and 1000 < made < 1024


def test_bad_requests_are_refused_naming_the_field(url):
    cases = [
        ({"egress": "nowhere"}, "egress 'nowhere' is not configured on this server; configured: none (see --egress)"),
        ({"memory_mb": 10**6}, "invalid request: memory_mb: Input should be less than or equal to 4096"),
        ({"disk_mb": 65}, "invalid request: disk_mb: Input should be less than or equal to 64"),
        ({"files": {"../x": "eA=="}}, "files: path escapes the work dir: '../x'"),
        ({"tar": "not base64!"}, "tar: not base64 (Only base64 data is allowed)"),
        ({"colour": "red"}, "invalid request: colour: Extra inputs are not permitted"),
    ]
    for body, message in cases:
        r = requests.post(f"{url}/sessions", json=body, timeout=60)
        assert (r.status_code, r.json()["message"]) == (422, message), body
    assert (
        requests.post(f"{url}/sessions/nope/exec", json={"command": "true"}, timeout=60).json()["message"]
        == "no open session 'nope' (closed, expired, or never opened)"
    )
    with _session(url) as s:
        sid = s["session_id"]
        r = requests.post(f"{url}/sessions/{sid}/exec", json={"command": "true", "timeout": 10**6}, timeout=60)
        assert (r.status_code, r.json()["message"]) == (
            422,
            "invalid request: timeout: Input should be less than or equal to 3600",
        )


def test_sessions_hold_slots_so_runs_wait_and_a_third_session_gets_429(url):
    a = _open(url)["session_id"]
    with _session(url), concurrent.futures.ThreadPoolExecutor(1) as pool:
        r = requests.post(f"{url}/sessions", json={}, timeout=60)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["message"] == "sandbox busy: every slot is running or queued for (--max-concurrency 2)"
        run = pool.submit(requests.post, f"{url}/run_code", json={"code": "print(6 * 7)"}, timeout=120)
        assert until(lambda: requests.get(f"{url}/v1/stats", timeout=10).json()["queued"] == 1)
        assert not run.done()
        _close(url, a)
        assert run.result().json()["run_result"]["stdout"] == "42\n"


def test_closing_a_session_kills_its_processes_and_the_next_one_starts_clean(url):
    s = _open(url)
    sid, uid = s["session_id"], s["uid"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert _exec(url, sid, "echo secret > left.txt")["returncode"] == 0
        busy = pool.submit(
            requests.post,
            f"{url}/sessions/{sid}/exec",
            json={"command": "sleep 100 & sleep 100", "timeout": 300},
            timeout=300,
        )
        assert until(lambda: len(_processes_of_uids([uid])) == 3)  # bash and its two sleeps
        _close(url, sid)
        r = busy.result()
        assert (r.status_code, r.json()["message"]) == (
            410,
            f"session {sid} was closed while this command ran; its processes were killed",
        )
        assert _processes_of_uids([uid]) == []
    with _session(url) as s2:
        assert _exec(url, s2["session_id"], "ls -A")["stdout"] == ""


def test_a_forgotten_session_is_closed_at_its_idle_deadline(url):
    sid = _open(url, idle_timeout=0.5)["session_id"]
    assert _exec(url, sid, "sleep 1; echo not idle while running")["stdout"] == "not idle while running\n"
    assert until(lambda: requests.get(f"{url}/sessions/{sid}", timeout=10).status_code == 404)
    listing = requests.get(f"{url}/sessions", timeout=10)
    assert listing.json()["closed_idle"] >= 1 and sid not in listing.text


def test_a_session_past_its_lifetime_is_closed_even_while_a_command_runs(url):
    sid = _open(url, max_lifetime=1)["session_id"]
    r = requests.post(f"{url}/sessions/{sid}/exec", json={"command": "sleep 60", "timeout": 120}, timeout=120)
    assert (r.status_code, r.json()["message"]) == (
        410,
        f"session {sid} was closed while this command ran; its processes were killed",
    )
    assert requests.get(f"{url}/sessions/{sid}", timeout=10).status_code == 404
    assert requests.get(f"{url}/sessions", timeout=10).json()["closed_lifetime"] >= 1


async def test_slime_sandbox_runs_the_sandbox_contract_and_exec_and_wait(url):
    from slime.agent.sandboxes.sandbox import (
        EXIT_TIME_BUDGET_EXCEEDED,
        ExecResult,
        Sandbox,
        ensure_agent_user,
        exec_and_wait,
    )
    from slime.agent.sandboxes.sandbox_slime import SlimeSandbox

    async with SlimeSandbox(url, files={"w/a.txt": "A"}, env={"X": "1"}) as sb:
        assert isinstance(sb, Sandbox) and sb.sandbox_id and sb.egress_url is None
        assert await sb.exec("cat w/a.txt; echo $X; exit 3", user="agent") == ExecResult(3, "A1\n", "")
        late = await sb.exec("sleep 5", timeout=1)
        assert (late.returncode, late.stdout) == (124, "")
        assert late.stderr.startswith("\n[sandbox] time limit exceeded after 1.")
        assert (await sb.status())["execs"] == 2 and sb.info["execs"] == 2
        await sb.write_file("/tmp/w/b.bin", b"\x00\xff")
        assert await sb.read_bytes("w/b.bin") == b"\x00\xff" and await sb.read_file("w/none") == ""
        await ensure_agent_user(sb, "/tmp/w")  # (slime's: `agent` is the session's uid, `git config --system` works)
        assert (
            await sb.exec("id -u agent; git config --system --get safe.directory")
        ).stdout == f"{sb.info['uid']}\n*\n"
        code, out = await exec_and_wait(
            sb,
            cmd="ls; echo $HOME; exit 4",
            time_budget_sec=30,
            tag="t",
            workdir="/tmp/w",
            user="agent",
            want_output=True,
        )
        assert (code, out) == (4, "a.txt\nb.bin\n/home/agent\n")
        assert await exec_and_wait(sb, cmd="echo ok", time_budget_sec=30, tag="t") == (0, "")
        assert await exec_and_wait(sb, cmd="echo late; sleep 30", time_budget_sec=1, tag="t") == (
            EXIT_TIME_BUDGET_EXCEEDED,
            "late\n",
        )
        with pytest.raises(RuntimeError, match="exit 2: ls nope"):
            await sb.exec("ls nope", check=True)
        sid = sb.sandbox_id
    assert requests.get(f"{url}/sessions/{sid}", timeout=10).status_code == 404


async def test_sessions_are_refused_without_isolation():
    from slime.sandbox.runner import Runner, SandboxConfig
    from slime.sandbox.server import Admission
    from slime.sandbox.sessions import SessionError, SessionSettings, SessionSpec, SessionTable

    runner = Runner(SandboxConfig(max_concurrency=1, isolate=False, uid_base=os.getuid()))
    try:
        table = SessionTable(runner, Admission(1, 1), SessionSettings())
        with pytest.raises(SessionError, match="sessions need the sandbox's isolation"):
            await table.open(SessionSpec(memory_mb=64, disk_mb=8, max_inodes=4096, idle_timeout=1, max_lifetime=1))
    finally:
        runner.close()
