"""Issue 23, `--ro-bind` below the places the sandbox makes itself: a host directory under /tmp (pytest's
tmp_path) bound at its own path, one at /home/..., one over an existing directory of /usr and a host file
under /etc, as bubblewrap nests them. Each is readable and read-only (nosuid, nodev) from runs and sessions,
while the rest of the run's /tmp, the session's /home and /workspace stay its own, writable and free of host
files; a venv bound at its own path runs unchanged. The start-time checks are pure (`parse_ro_binds`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.sandbox.ro_binds import parse_ro_binds
from tests.test_sandbox import ISOLATED

needs_isolation = pytest.mark.skipif(not ISOLATED, reason="binds need namespaces/uid switching")
HOME_INSIDE = "/home/dev/checkout"
USR_INSIDE = "/usr/local/src"  # (an empty directory of the FHS every Debian/Ubuntu /usr has)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from slime.sandbox.server import start_local_sandbox

    tools = tmp_path_factory.mktemp("tools")
    (tools.parent / "host-secret").write_text("never inside")  # a sibling of the bound directory
    (tools / "bin").mkdir()
    (tools / "bin" / "hello").write_text("#!/bin/sh\necho hello from the tools\n")
    (tools / "bin" / "hello").chmod(0o755)
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    for d in (tools, venv.parent):  # (the sandbox's uid must read them: a bind shows a directory's own modes)
        d.chmod(0o755)
    url, handle = start_local_sandbox(max_concurrency=2, extra_args=[
        "--ro-bind", str(tools), "--ro-bind", f"{tools}:{HOME_INSIDE}", "--ro-bind", f"{tools}:{USR_INSIDE}",
        "--ro-bind", f"{tools}/bin/hello:/etc/hello", "--ro-bind", str(venv.parent),
        "--ro-bind", os.path.realpath(sys.base_prefix)])
    yield {"url": url, "tools": str(tools), "venv": str(venv)}
    handle.stop()


def _run(url: str, script: str) -> dict:
    r = requests.post(f"{url}/run_code", json={"code": script, "language": "bash"}, timeout=60).json()
    return r["run_result"]


def _session_exec(url: str, script: str, sid: str | None = None) -> dict:
    own = sid is None
    if own:
        sid = requests.post(f"{url}/sessions", json={}, timeout=60).json()["session_id"]
    try:
        return requests.post(f"{url}/sessions/{sid}/exec", json={"command": script, "timeout": 60}, timeout=120).json()
    finally:
        if own:
            requests.delete(f"{url}/sessions/{sid}", timeout=60)


def _bound(path: str) -> str:
    """Runs it, fails to write it, shows its mount flags."""
    return (f"{path}/bin/hello; touch {path}/x 2>&1 | grep -c 'Read-only file system'; "
            f"grep \" $(realpath {path}) \" /proc/self/mountinfo | grep -o 'ro,nosuid,nodev' | uniq")


@needs_isolation
def test_a_directory_under_tmp_binds_at_its_own_path_and_the_rest_of_tmp_stays_the_runs_own(env):
    tools, parent = env["tools"], os.path.dirname(env["tools"])
    script = _bound(tools) + f"; echo mine > {parent}/mine; cat {parent}/mine; ls -A {parent}; ls -A /tmp"
    top = tools.split("/")[2]  # (pytest-of-<user>)
    bound = [os.path.basename(tools), os.path.basename(os.path.dirname(env["venv"]))]  # (not host-secret)
    expected = "hello from the tools\n1\nro,nosuid,nodev\nmine\n" + "".join(f"{n}\n" for n in sorted(["mine", *bound]))
    run = _run(env["url"], script)
    assert (run["stdout"], run["stderr"]) == (expected + f"main.sh\n{top}\n", "")
    out = _session_exec(env["url"], script)
    assert (out["stdout"], out["stderr"]) == (expected + f"{top}\n", "")
    assert not os.path.exists(f"{parent}/mine") and sorted(os.listdir(tools)) == ["bin"]


@needs_isolation
def test_a_bind_under_home_keeps_the_sessions_home_and_workspace_writable(env):
    script = _bound(HOME_INSIDE) + "; echo a > /home/agent/f; mkdir /home/new /workspace/d; ls -A /home /home/dev"
    out = _session_exec(env["url"], script)
    assert (out["stdout"], out["stderr"]) == (
        "hello from the tools\n1\nro,nosuid,nodev\n/home:\nagent\ndev\nnew\nroot\n\n/home/dev:\ncheckout\n", "")
    run = _run(env["url"], _bound(HOME_INSIDE) + "; readlink /home")
    assert run["stdout"] == "hello from the tools\n1\nro,nosuid,nodev\n/mnt/home\n"


@needs_isolation
def test_two_sessions_never_see_each_others_files_next_to_a_bind(env):
    url, parent = env["url"], os.path.dirname(env["tools"])
    a = requests.post(f"{url}/sessions", json={}, timeout=60).json()["session_id"]
    try:
        assert _session_exec(url, f"echo a > {parent}/a; echo a > /home/dev/a", a)["returncode"] == 0
        other = _session_exec(url, f"ls -A {parent} /home/dev")
        bound = sorted([os.path.basename(env["tools"]), os.path.basename(os.path.dirname(env["venv"]))])
        assert other["stdout"] == f"/home/dev:\ncheckout\n\n{parent}:\n" + "".join(f"{n}\n" for n in bound)
        assert _session_exec(url, f"cat {parent}/a /home/dev/a", a)["stdout"] == "a\na\n"
    finally:
        requests.delete(f"{url}/sessions/{a}", timeout=60)


@needs_isolation
def test_binds_nest_below_usr_and_etc_and_a_venv_runs_at_its_own_path(env):
    venv = env["venv"]
    run = _run(env["url"], _bound(USR_INSIDE) + f"; cat /etc/hello; {venv}/bin/python -c "
                           "'import sys; print(sys.prefix, sys.base_prefix == sys.prefix)'")
    assert (run["stdout"], run["stderr"]) == (
        "hello from the tools\n1\nro,nosuid,nodev\n#!/bin/sh\necho hello from the tools\n"
        f"{venv} False\n", "")
    health = requests.get(f"{env['url']}/health", timeout=10).json()
    assert health["ro_binds"] == [env["tools"], HOME_INSIDE, USR_INSIDE, "/etc/hello", os.path.dirname(venv),
                                  os.path.realpath(sys.base_prefix)]


# ---------------------------------------------------------------------------- start-time checks
def test_the_start_refuses_binds_that_would_hide_or_cannot_be_made(tmp_path):
    host = str(tmp_path)
    cases = {
        f"{host}:/tmp": "'/tmp' would hide /tmp, which the sandbox makes itself; bind below it (e.g. /tmp/..., "
                        "/opt/...)",
        f"{host}:/home/agent": "'/home/agent' would hide /home/agent, which the sandbox makes itself; bind below it "
                               "(e.g. /tmp/..., /opt/...)",
        f"{host}:/mnt/home/agent": "'/mnt/home/agent' would hide /home/agent, which the sandbox makes itself; bind "
                                   "below it (e.g. /tmp/..., /opt/...)",
        f"{host}:/etc/passwd": "'/etc/passwd' would hide /etc/passwd, which the sandbox makes itself; bind below it "
                               "(e.g. /tmp/..., /opt/...)",
        f"{host}:/usr": "'/usr' would hide /usr, which the sandbox makes itself; bind below it (e.g. /tmp/..., "
                        "/opt/...)",
        f"{host}:/dev/x": "'/dev/x' is under /dev, never bindable",
        f"{host}:/proc": "'/proc' is under /proc, never bindable",
        f"{host}:/bin/x": "'/bin/x' is under /bin, a link into /usr: bind below /usr/... instead",
        f"{host}:/usr/no-such-dir": "'/usr/no-such-dir' does not exist on the host, and the slot's /usr is the "
                                    "host's, read-only; create it on the host or bind elsewhere (e.g. /opt/...)",
        f"{host}:/usr/bin/env": "'/usr/bin/env' is a file on the host; " + repr(host) + " is not",
        f"{host}:/": "the path inside ('/') must be absolute and not /",
    }
    for spec, message in cases.items():
        with pytest.raises(ValueError) as e:
            parse_ro_binds([spec])
        assert str(e.value) == f"--ro-bind {spec!r}: {message}"


def test_binds_inside_binds_are_dropped_when_redundant_and_refused_otherwise(tmp_path):
    (tmp_path / "venv").mkdir()
    (tmp_path / "other").mkdir()
    t = str(tmp_path)
    assert parse_ro_binds([t, f"{t}/venv", "/usr", "/usr/lib"]) == [[t, t], ["/usr", "/usr"], ["/usr/lib", "/usr/lib"]]
    assert parse_ro_binds([f"{t}/venv:/opt/x/venv", f"{t}:/opt/x"]) == [[t, "/opt/x"]]
    with pytest.raises(ValueError) as e:
        parse_ro_binds([f"{t}:/opt/x", f"{t}/other:/opt/x/venv"])
    assert str(e.value) == (f"--ro-bind '{t}/other:/opt/x/venv': '/opt/x/venv' lies inside '/opt/x', bound "
                            f"read-only from {t!r}; bind it at a place of its own")
    with pytest.raises(ValueError) as e:
        parse_ro_binds([t, f"{t}/other:{t}"])
    assert str(e.value) == f"--ro-bind '{t}/other:{t}': {t!r} is already bound from {t!r}"
    with pytest.raises(ValueError) as e:  # (/home is a link to /mnt/home in a slot)
        parse_ro_binds([f"{t}:/home/u", f"{t}/other:/mnt/home/u"])
    assert str(e.value) == f"--ro-bind '{t}/other:/mnt/home/u': '/mnt/home/u' is already bound from {t!r}"


SEGMENTS = st.sampled_from(["tmp", "home", "mnt", "workspace", "usr", "etc", "dev", "proc", "sys", "bin", "lib64",
                            "opt", "agent", "root", "passwd", "local", "src", "x", ".old", ".."])


@settings(max_examples=300, deadline=None)
@given(st.lists(SEGMENTS, min_size=0, max_size=4))
def test_an_accepted_inside_path_never_hides_what_the_sandbox_makes_nor_reaches_the_kernels(parts):
    from slime.sandbox.ro_binds import MADE, NEVER, USR_LINKS, slot_path

    inside = os.path.normpath("/" + "/".join(parts))
    try:
        [[host, got]] = parse_ro_binds([f"/var:{inside}"])
    except ValueError as e:
        assert str(e).startswith(f"--ro-bind '/var:{inside}': ")
        return
    assert (host, got) == ("/var", inside) and inside != "/"
    assert not any(slot_path(m) == slot_path(inside) or slot_path(m).startswith(slot_path(inside) + "/") for m in MADE)
    assert not any(inside == r or inside.startswith(r + "/") for r in NEVER + USR_LINKS)
    assert not inside.startswith("/usr/") or os.path.isdir(inside) and os.path.realpath(inside) == inside
