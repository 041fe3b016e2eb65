"""Issue 23, `--ro-bind` below the places the sandbox makes itself: a host directory under /tmp (pytest's
tmp_path) bound at its own path, one at /home/..., one over an existing directory of /usr and a host file
under /etc, as bubblewrap nests them. Each is readable and read-only (nosuid, nodev) from runs and sessions,
while the rest of the run's /tmp, the session's /home and /workspace stay its own, writable and free of host
files; a venv bound at its own path runs unchanged. `--ro-path PATH` is `--ro-bind PATH`: a checkout and a
single file under the host's /tmp show at their own paths, read-only, and nothing else of the host's /tmp. The
start-time checks are pure (`parse_ro_binds`, `with_interpreter`), each naming its flag."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.sandbox.ro_binds import parse_ro_binds, with_interpreter
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
    checkout = tmp_path_factory.mktemp("checkout")  # (shown with --ro-path)
    (checkout / "bin").mkdir()
    (checkout / "bin" / "hello").write_text("#!/bin/sh\necho hello from the checkout\n")
    (checkout / "bin" / "hello").chmod(0o755)
    files = tmp_path_factory.mktemp("files")
    (files / "notes.txt").write_text("notes\n")  # (shown with --ro-path: the file alone)
    (files / "notes.txt").chmod(0o666)  # (writable by anyone on the host: read-only inside all the same)
    (files / "host-secret").write_text("never inside")
    for d in (tools, venv.parent, checkout):  # (the sandbox's uid must read them: a bind shows a directory's own modes)
        d.chmod(0o755)
    url, handle = start_local_sandbox(
        max_concurrency=2,
        extra_args=[
            "--ro-bind",
            str(tools),
            "--ro-bind",
            f"{tools}:{HOME_INSIDE}",
            "--ro-bind",
            f"{tools}:{USR_INSIDE}",
            "--ro-bind",
            f"{tools}/bin/hello:/etc/hello",
            "--ro-bind",
            str(venv.parent),
            "--ro-bind",
            os.path.realpath(sys.base_prefix),
            "--ro-path",
            str(checkout),
            "--ro-path",
            str(files / "notes.txt"),
        ],
    )
    yield {
        "url": url,
        "tools": str(tools),
        "venv": str(venv),
        "checkout": str(checkout),
        "notes": str(files / "notes.txt"),
    }
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


def _shown_in_tmp(env: dict) -> list[str]:
    """What a run sees of the directory holding the bound host paths (pytest's base temp): those alone."""
    return sorted(
        os.path.basename(p)
        for p in (env["tools"], os.path.dirname(env["venv"]), env["checkout"], os.path.dirname(env["notes"]))
    )


def _bound(path: str) -> str:
    """Runs it, fails to write it, shows its mount flags."""
    return (
        f"{path}/bin/hello; touch {path}/x 2>&1 | grep -c 'Read-only file system'; "
        f"grep \" $(realpath {path}) \" /proc/self/mountinfo | grep -o 'ro,nosuid,nodev' | uniq"
    )


@needs_isolation
def test_a_directory_under_tmp_binds_at_its_own_path_and_the_rest_of_tmp_stays_the_runs_own(env):
    tools, parent = env["tools"], os.path.dirname(env["tools"])
    script = _bound(tools) + f"; echo mine > {parent}/mine; cat {parent}/mine; ls -A {parent}; ls -A /tmp"
    top = tools.split("/")[2]  # (pytest-of-<user>)
    bound = _shown_in_tmp(env)  # (not host-secret)
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
        "hello from the tools\n1\nro,nosuid,nodev\n/home:\nagent\ndev\nnew\nroot\n\n/home/dev:\ncheckout\n",
        "",
    )
    run = _run(env["url"], _bound(HOME_INSIDE) + "; readlink /home")
    assert run["stdout"] == "hello from the tools\n1\nro,nosuid,nodev\n/mnt/home\n"


@needs_isolation
def test_two_sessions_never_see_each_others_files_next_to_a_bind(env):
    url, parent = env["url"], os.path.dirname(env["tools"])
    a = requests.post(f"{url}/sessions", json={}, timeout=60).json()["session_id"]
    try:
        assert _session_exec(url, f"echo a > {parent}/a; echo a > /home/dev/a", a)["returncode"] == 0
        other = _session_exec(url, f"ls -A {parent} /home/dev")
        bound = _shown_in_tmp(env)
        assert other["stdout"] == f"/home/dev:\ncheckout\n\n{parent}:\n" + "".join(f"{n}\n" for n in bound)
        assert _session_exec(url, f"cat {parent}/a /home/dev/a", a)["stdout"] == "a\na\n"
    finally:
        requests.delete(f"{url}/sessions/{a}", timeout=60)


@needs_isolation
def test_binds_nest_below_usr_and_etc_and_a_venv_runs_at_its_own_path(env):
    venv = env["venv"]
    run = _run(
        env["url"],
        _bound(USR_INSIDE) + f"; cat /etc/hello; {venv}/bin/python -c "
        "'import sys; print(sys.prefix, sys.base_prefix == sys.prefix)'",
    )
    assert (run["stdout"], run["stderr"]) == (
        f"hello from the tools\n1\nro,nosuid,nodev\n#!/bin/sh\necho hello from the tools\n{venv} False\n",
        "",
    )
    health = requests.get(f"{env['url']}/health", timeout=10).json()
    assert health["ro_binds"] == [
        env["checkout"],
        env["notes"],
        env["tools"],
        HOME_INSIDE,
        USR_INSIDE,
        "/etc/hello",
        os.path.dirname(venv),
        os.path.realpath(sys.base_prefix),
    ]


@needs_isolation
def test_a_ro_path_under_tmp_shows_at_its_own_path_read_only_and_nothing_else_of_the_hosts_tmp(env):
    import slime

    co, notes, parent = env["checkout"], env["notes"], os.path.dirname(env["checkout"])
    server_checkout = os.path.dirname(os.path.dirname(slime.__file__))
    script = (
        _bound(co) + f"; cat {notes}; (echo more >> {notes}) 2>&1 | grep -c 'Read-only file system'; "
        f"ls -A {os.path.dirname(notes)}; echo mine > {parent}/mine; cat {parent}/mine; "
        f"ls -d {server_checkout} 2>&1 | grep -c 'No such file'; ls -A /tmp"
    )
    top = co.split("/")[2]  # (pytest-of-<user>: the host's other /tmp entries are never shown)
    expected = "hello from the checkout\n1\nro,nosuid,nodev\nnotes\n1\nnotes.txt\nmine\n1\n"
    run = _run(env["url"], script)
    assert (run["stdout"], run["stderr"]) == (expected + f"main.sh\n{top}\n", "")
    out = _session_exec(env["url"], script)
    assert (out["stdout"], out["stderr"]) == (expected + f"{top}\n", "")
    assert _run(env["url"], f"ls -A {parent}")["stdout"] == "".join(f"{n}\n" for n in _shown_in_tmp(env))
    assert Path(notes).read_text() == "notes\n" and sorted(os.listdir(co)) == ["bin"]
    assert not os.path.exists(f"{parent}/mine")


@needs_isolation
def test_an_interpreter_outside_usr_runs_from_its_prefix_bound_at_its_own_path():
    from slime.sandbox.server import start_local_sandbox

    py = os.path.realpath(sys.executable)
    prefix = os.path.dirname(os.path.dirname(py))
    url, handle = start_local_sandbox(max_concurrency=1, extra_args=["--python", py])
    try:
        r = requests.post(
            f"{url}/run_code",
            json={"code": "import sys, decimal; print(sys.prefix, sys.executable)", "language": "python"},
            timeout=60,
        ).json()
        assert (r["run_result"]["stdout"], r["run_result"]["stderr"]) == (f"{prefix} {py}\n", "")
        assert requests.get(f"{url}/health", timeout=10).json()["ro_binds"] == ([] if prefix == "/usr" else [prefix])
    finally:
        handle.stop()


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
    assert str(e.value) == (
        f"--ro-bind '{t}/other:/opt/x/venv': '/opt/x/venv' lies inside '/opt/x', bound "
        f"read-only from {t!r}; bind it at a place of its own"
    )
    with pytest.raises(ValueError) as e:
        parse_ro_binds([t, f"{t}/other:{t}"])
    assert str(e.value) == f"--ro-bind '{t}/other:{t}': {t!r} is already bound from {t!r}"
    with pytest.raises(ValueError) as e:  # (/home is a link to /mnt/home in a slot)
        parse_ro_binds([f"{t}:/home/u", f"{t}/other:/mnt/home/u"])
    assert str(e.value) == f"--ro-bind '{t}/other:/mnt/home/u': '/mnt/home/u' is already bound from {t!r}"


SEGMENTS = st.sampled_from(
    [
        "tmp",
        "home",
        "mnt",
        "workspace",
        "usr",
        "etc",
        "dev",
        "proc",
        "sys",
        "bin",
        "lib64",
        "opt",
        "agent",
        "root",
        "passwd",
        "local",
        "src",
        "x",
        ".old",
        "..",
    ]
)


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


# ---------------------------------------------------------------------------- --ro-path: --ro-bind at its own path
def test_ro_paths_are_binds_at_their_own_path_refused_as_binds_are_naming_the_flag(tmp_path):
    (tmp_path / "co").mkdir()
    (tmp_path / "a:b").mkdir()  # (taken whole: no HOST:INSIDE split)
    t = str(tmp_path)
    assert parse_ro_binds([f"{t}/co:/opt/co"], [f"{t}/co", f"{t}/a:b"]) == [
        [f"{t}/co", f"{t}/co"],
        [f"{t}/a:b", f"{t}/a:b"],
        [f"{t}/co", "/opt/co"],
    ]
    cases = {
        "/dev": "'/dev' is under /dev, never bindable",
        "/proc/self": "'/proc/self' is under /proc, never bindable",
        "/sys": "'/sys' is under /sys, never bindable",
        "/": "the path inside ('/') must be absolute and not /",
        "/tmp": "'/tmp' would hide /tmp, which the sandbox makes itself; bind below it (e.g. /tmp/..., /opt/...)",
        "/etc": "'/etc' would hide /etc, which the sandbox makes itself; bind below it (e.g. /tmp/..., /opt/...)",
        f"{t}/missing": f"the host path '{t}/missing' does not exist",
    }
    for path, message in cases.items():
        with pytest.raises(ValueError) as e:
            parse_ro_binds([], [path])
        assert str(e.value) == f"--ro-path {path!r}: {message}"
    for binds, paths, message in [
        ([], [f"{t}/co", f"{t}/co"], f"--ro-path '{t}/co': '{t}/co' is already bound from '{t}/co'"),
        ([f"{t}/co"], [f"{t}/co"], f"--ro-bind '{t}/co': '{t}/co' is already bound from '{t}/co'"),
        ([f"{t}/a:b:{t}/co"], [f"{t}/co"], f"--ro-bind '{t}/a:b:{t}/co': the host path '{t}/a' does not exist"),
        (
            [f"{t}/co:{t}"],
            [f"{t}/a:b"],
            f"--ro-path '{t}/a:b': '{t}/a:b' lies inside {t!r}, bound read-only from "
            f"'{t}/co'; bind it at a place of its own",
        ),
    ]:
        with pytest.raises(ValueError) as e:
            parse_ro_binds(binds, paths)
        assert str(e.value) == message


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--ro-path", "/nonexistent/venv"],
            "--ro-path '/nonexistent/venv': the host path '/nonexistent/venv' does not exist",
        ),
        (["--ro-path", "/proc"], "--ro-path '/proc': '/proc' is under /proc, never bindable"),
        (
            ["--ro-path", "/usr/share", "--ro-bind", "/usr/share"],
            "--ro-bind '/usr/share': '/usr/share' is already bound from '/usr/share'",
        ),
    ],
)
def test_a_bad_ro_path_refuses_the_start_naming_the_flag(flags, message, capsys):
    from slime.sandbox.server import main

    with pytest.raises(SystemExit) as e:
        main(flags)
    assert e.value.code == 2
    assert capsys.readouterr().err == f"slime-sandbox: refusing to start: {message}\n"


HOST_SEGMENTS = st.sampled_from(
    [
        "tmp",
        "home",
        "mnt",
        "usr",
        "etc",
        "dev",
        "proc",
        "sys",
        "bin",
        "lib",
        "opt",
        "var",
        "root",
        "share",
        "local",
        "src",
        "passwd",
        "..",
        "co",
        "link",
        "f",
    ]
)


@pytest.fixture(scope="module")
def host_tree(tmp_path_factory):
    """Under the host's /tmp: a directory, a file and a link to the directory, for --ro-path to name."""
    tree = tmp_path_factory.mktemp("tree")
    (tree / "co").mkdir()
    (tree / "f").write_text("")
    (tree / "link").symlink_to(tree / "co")
    return str(tree)


@settings(max_examples=300, deadline=None)
@given(below_tree=st.booleans(), parts=st.lists(HOST_SEGMENTS, min_size=0, max_size=3))
def test_a_ro_path_is_accepted_or_refused_exactly_as_the_same_ro_bind(host_tree, below_tree, parts):
    path = os.path.normpath(os.path.join(host_tree if below_tree else "/", *parts))
    try:
        as_bind = parse_ro_binds([path])
    except ValueError as e:
        with pytest.raises(ValueError) as refused:
            parse_ro_binds([], [path])
        assert str(refused.value) == str(e).replace("--ro-bind", "--ro-path", 1)
        return
    assert parse_ro_binds([], [path]) == as_bind == [[os.path.realpath(path), path]]


# ---------------------------------------------------------------------------- the interpreter's prefix
@pytest.fixture
def interpreter():
    """A Python outside /usr and outside the places the runs make their own: its prefix is bound."""
    import shutil
    import tempfile

    prefix = tempfile.mkdtemp(prefix="slime-ropath-", dir="/var/tmp")
    os.mkdir(f"{prefix}/bin")
    open(f"{prefix}/bin/python3", "w").close()
    yield prefix
    shutil.rmtree(prefix)


def test_the_interpreters_prefix_is_bound_once_at_its_own_path(interpreter, tmp_path):
    py = f"{interpreter}/bin/python3"
    other = [str(tmp_path), "/opt/x"]
    assert with_interpreter([other], "/usr/bin/python3") == [other]
    assert with_interpreter([other], py) == [other, [interpreter, interpreter]]
    assert with_interpreter([[interpreter, interpreter]], py) == [[interpreter, interpreter]]
    assert with_interpreter([["/var/tmp", "/var/tmp"]], py) == [["/var/tmp", "/var/tmp"]]  # (shown by the outer one)
    assert with_interpreter([[f"{interpreter}/bin", f"{interpreter}/bin"]], py) == [[interpreter, interpreter]]
    with pytest.raises(ValueError) as e:
        with_interpreter([[str(tmp_path), interpreter]], py)
    assert str(e.value) == f"--python {py!r}: its prefix {interpreter!r} is already bound from {str(tmp_path)!r}"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").write_text("")
    with pytest.raises(ValueError) as e:
        with_interpreter([], f"{tmp_path}/bin/python3")
    assert str(e.value) == (
        f"--python '{tmp_path}/bin/python3': its prefix {str(tmp_path)!r} is under /tmp, which "
        "each run makes its own, and the fork servers import from it before any run; use an "
        "interpreter installed elsewhere"
    )
