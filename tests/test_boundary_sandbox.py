"""Request bodies at the sandbox server, hypothesis-generated: `/run_code` (SandboxFusion's fields)
and a session's exec and file routes. A body with a field replaced by a wrong type, a huge or
negative number, a NUL byte, bad base64 or an unknown language -- or bytes that are not a JSON
object -- is answered 422 in SandboxFusion's error shape naming the field, never a 500, never a
hang, and never a silent failure (a run that did not start because of its input, reported as a
finished one with nothing to say)."""

from __future__ import annotations

import base64
import json

import pytest
import requests
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from slime.testing.json_paths import paths_of, replaced
from tests.test_sandbox import ISOLATED

pytestmark = pytest.mark.skipif(not ISOLATED, reason="the sandbox needs namespaces/uid switching")
RUN = {
    "code": "import sys; print(sys.stdin.read() + open('a.txt').read())",
    "language": "python",
    "run_timeout": 5,
    "compile_timeout": 5,
    "memory_limit_MB": -1,
    "stdin": "in",
    "files": {"a.txt": "YQ=="},
    "fetch_files": ["a.txt"],
}
EXEC = {"command": "cat; echo hi", "env": {"A": "b"}, "cwd": "/tmp", "timeout": 10, "stdin": "x"}
WRITE = {"path": "w.txt", "content": "YQ=="}
RUN_STATUSES = {"Success", "Failed", "SandboxError"}


@pytest.fixture(scope="module")
def url():
    from slime.sandbox.server import start_local_sandbox

    url, handle = start_local_sandbox(max_concurrency=2, max_queue=16)
    yield url
    handle.stop()


@pytest.fixture(scope="module")
def sid(url):
    r = requests.post(f"{url}/sessions", json={}, timeout=60)
    assert r.status_code == 200, r.text
    yield r.json()["session_id"]
    requests.delete(f"{url}/sessions/{r.json()['session_id']}", timeout=60)


def send(method: str, url: str, raw: bytes) -> requests.Response:
    return requests.request(method, url, data=raw, headers={"Content-Type": "application/json"}, timeout=60)


def refused_field(resp: requests.Response) -> str:
    """The field a 422 names, after checking SandboxFusion's error shape."""
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert body["status"] == "SandboxError" and body["message"].startswith("invalid request: "), body
    return body["message"][len("invalid request: ") :]


bad_values = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.text(max_size=10).map(lambda s: s + "\x00"),  # a NUL byte: cuts an exec argument short
    st.sampled_from(["", "!!not base64", "cobol", "../../etc/passwd", "A=B", "-1"]),
)


@st.composite
def broken(draw, valid: dict):
    path = draw(st.sampled_from(paths_of(valid)))
    key = draw(st.sampled_from(["A=B", "", "A\x00", "B"])) if path == ("env", "A") else None
    body = replaced(valid, path, draw(bad_values))
    if key is not None:  # a bad variable name rather than a bad value
        body["env"] = {key: "v"}
    return path[0], body


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=broken(RUN))
@example(case=("files", replaced(RUN, ("files", "a.txt"), "!!not base64")))
@example(case=("language", replaced(RUN, ("language",), "cobol")))
def test_run_code_refuses_a_broken_field_naming_it_or_runs_it(url, case):
    field, body = case
    resp = send("POST", f"{url}/run_code", json.dumps(body).encode())
    if resp.status_code == 200:
        out = resp.json()
        assert out["status"] in RUN_STATUSES
        assert "bad input file" not in out["message"]  # the input is refused before the run, not inside it
        return
    assert refused_field(resp).split(",")[0].split(".")[0] == field


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=broken(EXEC))
@example(case=("env", replaced(EXEC, ("env",), {"A=B": "v"})))
@example(case=("env", replaced(EXEC, ("env",), {"A\x00": "v"})))
@example(case=("command", replaced(EXEC, ("command",), "echo \x00 hi")))
@example(case=("cwd", replaced(EXEC, ("cwd",), "\x00")))
def test_exec_refuses_a_broken_field_naming_it_or_runs_it(url, sid, case):
    field, body = case
    resp = send("POST", f"{url}/sessions/{sid}/exec", json.dumps(body).encode())
    if resp.status_code == 200:
        out = resp.json()
        assert out["status"] in {"Finished", "TimeLimitExceeded"}, out
        assert out["returncode"] == 0 or out["stderr"] or out["message"], out  # never a silent failure
        return
    assert refused_field(resp).split(":")[0].split(".")[0] == field


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=broken(WRITE))
@example(case=("path", replaced(WRITE, ("path",), "\x00")))
@example(case=("content", replaced(WRITE, ("content",), "!!")))
def test_file_writes_refuse_a_broken_field_naming_it_or_write(url, sid, case):
    field, body = case
    resp = send("PUT", f"{url}/sessions/{sid}/files", json.dumps(body).encode())
    if resp.status_code == 200:
        assert resp.json() == {"path": body["path"]}
        read = requests.get(f"{url}/sessions/{sid}/files", params={"path": body["path"]}, timeout=60)
        assert base64.b64decode(read.json()["content"]) == base64.b64decode(body["content"])
        return
    assert resp.status_code == 422, resp.text
    message = resp.json()["message"]
    assert resp.json()["status"] == "SandboxError" and (field in message or repr(body["path"]) in message), message


def test_a_read_of_a_path_with_a_nul_byte_is_refused(url, sid):
    resp = requests.get(f"{url}/sessions/{sid}/files", params={"path": "a\x00b"}, timeout=60)
    assert refused_field(resp) == "query.path is required and must not contain a NUL byte"


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=st.one_of(st.binary(max_size=40), st.lists(st.integers(), max_size=3).map(lambda v: json.dumps(v).encode())),
    route=st.sampled_from(["run_code", "exec", "open"]),
)
@example(raw=b"[" * 100_000, route="run_code")
@example(raw=b"\xff\xfe", route="exec")
def test_bytes_that_are_not_a_json_object_are_refused(url, sid, raw, route):
    try:
        if isinstance(json.loads(raw), dict):
            return  # an object: its fields are the tests above
    except (ValueError, RecursionError):
        pass
    target = {"run_code": f"{url}/run_code", "exec": f"{url}/sessions/{sid}/exec", "open": f"{url}/sessions"}[route]
    if route != "run_code" and raw == b"":
        return  # a session route reads an empty body as {} (opening a session with the defaults)
    field = refused_field(send("POST", target, raw))
    assert field.startswith("body")
