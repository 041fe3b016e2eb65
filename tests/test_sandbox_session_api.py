"""Issue 30, item 6: `GET /sessions` lists no session id; a session command whose client goes away is
stopped (the session stays, and its next command runs at once, never 409); a workspace copy-out
fails naming a file `tar` could not read; a NUL byte in a `metadata.files` path is refused."""

from __future__ import annotations

import json
import socket

import pytest
import requests

from slime.agent.sandboxes.workspace import WorkspaceError, WorkspaceSeed
from slime.testing.until import until
from tests.test_sandbox import ISOLATED, _processes_of_uids

needs_isolation = pytest.mark.skipif(not ISOLATED, reason="sessions need namespaces/uid switching")


@pytest.fixture(scope="module")
def url():
    from slime.sandbox.server import start_local_sandbox

    u, handle = start_local_sandbox(max_concurrency=2)
    yield u
    handle.stop()


@needs_isolation
def test_the_session_listing_names_no_session(url):
    sid = requests.post(f"{url}/sessions", json={}, timeout=60).json()["session_id"]
    try:
        listing = requests.get(f"{url}/sessions", timeout=60)
        assert listing.json()["sessions"] and sid not in listing.text, listing.text
    finally:
        requests.delete(f"{url}/sessions/{sid}", timeout=60)


def _sleeping(uid: int) -> bool:
    """A process of `uid` is running `sleep`."""
    for pid in _processes_of_uids([uid]):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "sleep":
                    return True
        except OSError:  # gone meanwhile
            pass
    return False


@needs_isolation
def test_a_command_whose_client_went_is_stopped_and_the_next_one_runs(url):
    info = requests.post(f"{url}/sessions", json={}, timeout=60).json()
    sid = info["session_id"]
    try:
        host, port = url.split("//", 1)[1].split(":")
        body = json.dumps({"command": "echo kept > kept.txt; sleep 300", "timeout": 600}).encode()
        client = socket.create_connection((host, int(port)), timeout=60)
        client.sendall(
            (
                f"POST /sessions/{sid}/exec HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )
        # `sleep` runs only once the `echo` before it has written the file (a process of the session's uid alone
        # could be the shell not yet past it: then the client's leaving stopped the command before the echo)
        assert until(lambda: _sleeping(info["uid"]), timeout=60), "the command never reached its sleep"
        client.close()  # the client goes while `sleep 300` runs
        r = requests.post(f"{url}/sessions/{sid}/exec", json={"command": "cat kept.txt", "timeout": 30}, timeout=120)
        assert r.status_code == 200 and r.json()["stdout"] == "kept\n", r.text  # (not 409 after 30 s)
        assert not _processes_of_uids([info["uid"]])
    finally:
        requests.delete(f"{url}/sessions/{sid}", timeout=60)


@needs_isolation
async def test_a_copy_out_that_tar_could_not_read_whole_fails_naming_the_file(url):
    from slime.agent.sandboxes.sandbox_slime import SlimeSandbox
    from slime.agent.sandboxes.workspace import download, unpack

    async with SlimeSandbox(url, files={"w/a.txt": "A", "w/secret.txt": "S"}) as sb:
        assert unpack(await download(sb, "/tmp/w")) == {"a.txt": b"A", "secret.txt": b"S"}
        await sb.exec("chmod 000 /tmp/w/secret.txt", check=True)
        with pytest.raises(RuntimeError, match=r"secret\.txt: Cannot open: Permission denied"):
            await download(sb, "/tmp/w")


def test_a_nul_byte_in_a_workspace_path_is_refused_naming_the_field():
    with pytest.raises(WorkspaceError, match=r"row 1: metadata.files: 'a\\x00b' must be a relative path"):
        WorkspaceSeed.from_metadata({"files": {"a\x00b": "x"}}, "row 1")
    with pytest.raises(WorkspaceError, match=r"metadata.grade_files"):
        WorkspaceSeed.from_metadata({"grade_files": {"t/\x00": "x"}}, "row 1")
