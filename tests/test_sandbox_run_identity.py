"""Issue 30, items 1-2: the slot's init (root) reads `fetch_files` and writes request `files` with the
run's identity, one component at a time from the work dir, never through a link. A 0600 root-owned
file inside an `--ro-path` bind does not come out (directly or through a link the run made); a
directory link into /proc/sys/net/ipv4 inside a bind cannot be written through (run or session);
`open_beneath` is property-tested on a tree with links, `..`, NUL, absolute and very long paths."""

from __future__ import annotations

import base64
import errno
import os
import stat
import threading

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime.sandbox.run_files import open_beneath, write_file
from tests.test_sandbox import ISOLATED

needs_isolation = pytest.mark.skipif(
    not ISOLATED or os.geteuid() != 0, reason="the init must be root for its identity to matter"
)
SYSCTL = "/proc/sys/net/ipv4/ip_unprivileged_port_start"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from slime.sandbox.server import start_local_sandbox

    shown = tmp_path_factory.mktemp("shown")
    (shown / "secret").write_text("root only")
    (shown / "secret").chmod(0o600)
    (shown / "public").write_text("anyone")
    (shown / "public").chmod(0o644)
    (shown / "net").symlink_to("/proc/sys/net/ipv4")
    shown.chmod(0o755)
    url, handle = start_local_sandbox(max_concurrency=1, extra_args=["--ro-path", str(shown)])
    yield url, str(shown)
    handle.stop()


def _run(url, code, **kw):
    return requests.post(f"{url}/run_code", json={"code": code, "language": "bash", **kw}, timeout=60).json()


@needs_isolation
def test_a_file_the_run_cannot_read_is_not_fetched_directly_nor_through_its_link(env):
    url, shown = env
    r = _run(
        url,
        f"test -r {shown}/secret || echo unreadable; ln -s {shown}/secret link; ln -s {shown}/public pub",
        fetch_files=[f"{shown}/secret", "link", f"{shown}/public", "pub"],
    )
    assert r["run_result"]["stdout"] == "unreadable\n", r
    assert {k: base64.b64decode(v) for k, v in r["files"].items()} == {f"{shown}/public": b"anyone"}, r
    assert "Permission denied" in r["not_fetched"][f"{shown}/secret"], r["not_fetched"]
    assert r["not_fetched"]["link"] == "'link' goes through a symbolic link ('link'): refused"
    assert "symbolic link" in r["not_fetched"]["pub"]


@needs_isolation
def test_request_files_are_not_written_through_a_directory_link_into_proc_sys(env):
    url, shown = env
    before = _run(url, f"cat {SYSCTL}")["run_result"]["stdout"]
    r = _run(url, f"cat {SYSCTL}", files={f"{shown}/net/ip_unprivileged_port_start": base64.b64encode(b"81").decode()})
    link = f"{shown[len('/tmp/') :]}/net"  # (named as the init sees it: relative to the work dir)
    assert r["status"] == "Failed" and "symbolic link" in r["message"] and f"({link!r})" in r["message"], r
    assert _run(url, f"cat {SYSCTL}")["run_result"]["stdout"] == before != "81\n"
    s = requests.post(
        f"{url}/sessions",
        timeout=60,
        json={"files": {f"{shown}/net/ip_unprivileged_port_start": base64.b64encode(b"81").decode()}},
    )
    assert s.status_code == 422 and "symbolic link" in s.json()["message"], s.text
    assert _run(url, f"cat {SYSCTL}")["run_result"]["stdout"] == before


@needs_isolation
def test_request_files_are_written_as_the_runs_uid_and_not_into_a_read_only_bind(env):
    url, shown = env
    r = _run(url, "stat -c '%u %U' d/f", files={"d/f": base64.b64encode(b"x").decode()})
    uid, _ = r["run_result"]["stdout"].split()
    assert int(uid) != 0, r
    r = _run(url, "true", files={f"{shown}/new": base64.b64encode(b"x").decode()})
    assert r["status"] == "Failed" and "Read-only file system" in r["message"], r


# -- open_beneath, on a tree of our own -------------------------------------------------------
COMPONENTS = ["a", "d", "f", "lnk", "dlnk", "out", "..", ".", "", "x\x00y", "n" * 300]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    top = tmp_path_factory.mktemp("beneath")
    root = top / "root"
    (root / "d" / "a").mkdir(parents=True)
    (root / "f").write_text("inside")
    (root / "d" / "f").write_text("inside d")
    (top / "outside").write_text("outside")
    (root / "lnk").symlink_to(root / "f")
    (root / "dlnk").symlink_to(root / "d")
    (root / "out").symlink_to(top / "outside")
    (root / "d" / "out").symlink_to("../../outside")
    return str(root)


def _lexical_links(root: str, parts: list[str]) -> bool:
    cur = root
    for p in parts:
        cur = os.path.join(cur, p)
        if os.path.islink(cur):
            return True
    return False


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.sampled_from(COMPONENTS), min_size=0, max_size=6), lead=st.booleans(), write=st.booleans())
def test_open_beneath_never_leaves_the_root_nor_follows_a_link(tree, parts, lead, write):
    path = ("/" if lead else "") + "/".join(parts)
    flags = (os.O_WRONLY | os.O_CREAT | os.O_APPEND) if write else os.O_RDONLY
    before = sorted(os.listdir(os.path.dirname(tree)))
    try:
        fd = open_beneath(tree, path, flags, make_dirs=write)
    except OSError as e:
        assert repr(path) in str(e), (path, e)  # the refusal names the path
        if e.errno == errno.ELOOP:
            assert _lexical_links(tree, [p for p in path.split("/") if p not in ("", ".")])
        return
    finally:
        assert sorted(os.listdir(os.path.dirname(tree))) == before  # nothing made outside the root
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
        clean = [p for p in path.split("/") if p not in ("", ".")]
        assert "\x00" not in path and not lead and ".." not in clean and clean
        assert real == os.path.join(tree, *clean), (path, real)  # the lexical path, no link on its way
        assert not _lexical_links(tree, clean) and not stat.S_ISLNK(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def test_a_request_file_is_never_written_into_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "pipe")  # (as one inside a read-only bind: opening it to write needs no write to the mount)
    failed = []

    def write() -> None:
        try:
            write_file(str(tmp_path), "pipe", b"x", os.getuid())
        except OSError as e:
            failed.append(str(e))

    th = threading.Thread(target=write, daemon=True)
    th.start()
    th.join(60)
    assert not th.is_alive(), "the write waited for a reader of the FIFO"
    assert failed and "'pipe'" in failed[0], failed
