"""Issue 30, item 2: bodies bounded on every route and never parsed on the event loop. A 26 MB body of
millions of keys (`env` on `/sessions`, `files` on `/run_code`) is refused (422 naming the budget)
without a parse, and `/v1/ping` is answered while it arrives; `env` is capped in count and bytes
for a session and an exec (422 naming the field); `KeyBudget` counts keys chunk by chunk as the
whole body's scan does."""

from __future__ import annotations

import json
import socket

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.sandbox.config import SandboxConfig
from slime.sandbox.schema import KeyBudget, count_keys
from tests.test_sandbox import ISOLATED

needs_isolation = pytest.mark.skipif(not ISOLATED, reason="sessions need namespaces/uid switching")


@pytest.fixture(scope="module")
def url():
    from slime.sandbox.server import start_local_sandbox

    u, handle = start_local_sandbox(max_concurrency=2)
    yield u
    handle.stop()


def _open_post(url: str, path: str, body: bytes) -> socket.socket:
    """A POST whose headers and first half of `body` are sent; the caller sends the rest."""
    host, port = url.split("//", 1)[1].split(":")
    s = socket.create_connection((host, int(port)), timeout=120)
    s.sendall(
        (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body[: len(body) // 2]
    )
    return s


def _answer(s: socket.socket) -> tuple[int, dict]:
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, rest = data.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(rest) < length:
        rest += s.recv(65536)
    return int(head.split(b" ", 2)[1]), json.loads(rest)


def _ping_then_finish(url: str, path: str, body: bytes) -> tuple[int, dict]:
    s = _open_post(url, path, body)
    try:
        assert requests.get(f"{url}/v1/ping", timeout=60).text == "pong"  # (half of the body still to come)
        s.sendall(body[len(body) // 2 :])
        return _answer(s)
    finally:
        s.close()


@needs_isolation
def test_a_26_mb_env_of_millions_of_entries_is_refused_unparsed_while_ping_answers(url):
    body = b'{"env": {' + b",".join(b'"%x":""' % i for i in range(2_400_000)) + b"}}"
    assert 26 << 20 < len(body) < SandboxConfig().max_body_mb << 20
    opened = requests.get(f"{url}/sessions", timeout=60).json()["opened"]
    status, answer = _ping_then_finish(url, "/sessions", body)
    assert status == 422 and "keys in the body" in answer["message"] and "env variables" in answer["message"], answer
    assert requests.get(f"{url}/sessions", timeout=60).json()["opened"] == opened


def test_a_26_mb_file_list_on_run_code_is_refused_while_ping_answers(url):
    body = b'{"code": "print(1)", "files": {' + b",".join(b'"%x":""' % i for i in range(2_400_000)) + b"}}"
    status, answer = _ping_then_finish(url, "/run_code", body)
    assert status == 422 and answer["detail"][0]["loc"] == ["body", "files"], answer


@needs_isolation
def test_env_is_capped_in_count_and_bytes_for_a_session_and_an_exec(url):
    cfg = SandboxConfig()
    many = {f"V{i}": "" for i in range(cfg.max_env_vars + 1)}
    r = requests.post(f"{url}/sessions", json={"env": many}, timeout=60)
    assert r.status_code == 422 and "env" in r.json()["message"], r.text
    big = {"BIG": "x" * cfg.max_env_bytes}
    r = requests.post(f"{url}/sessions", json={"env": big}, timeout=60)
    assert r.status_code == 422 and "env" in r.json()["message"] and "bytes" in r.json()["message"], r.text
    sid = requests.post(f"{url}/sessions", json={}, timeout=60).json()["session_id"]
    try:
        r = requests.post(f"{url}/sessions/{sid}/exec", json={"command": "true", "env": big}, timeout=60)
        assert r.status_code == 422 and "env" in r.json()["message"], r.text
        near = {f"V{i}": "x" * 100_000 for i in range(cfg.max_env_bytes // 100_010)}  # (one string: at most 128 KiB)
        ok = requests.post(
            f"{url}/sessions/{sid}/exec",
            timeout=60,
            json={"command": "X=" + "y" * 100_000 + "; echo ${#X} ${#V0}", "env": near},
        ).json()
        assert ok["stdout"] == "100000 100000\n", ok  # (a long command and env go to the fork server whole)
    finally:
        requests.delete(f"{url}/sessions/{sid}", timeout=60)


@settings(max_examples=60, deadline=None)
@given(
    doc=st.recursive(
        st.text(max_size=5) | st.integers(),
        lambda c: st.dictionaries(st.text(max_size=6), c, max_size=6) | st.lists(c, max_size=4),
        max_leaves=40,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    enough=st.integers(0, 30),
)
def test_the_budget_counted_while_a_body_arrives_is_the_whole_bodys_count(doc, cuts, enough):
    raw = json.dumps({"files": doc}).encode()
    points = sorted({min(c, len(raw)) for c in cuts} | {len(raw)})
    budget, chunks, start, over = KeyBudget(enough), [], 0, False
    for p in points:
        chunks.append(raw[start:p])
        start = p
        over = over or budget.over(chunks, p == len(raw))
    assert over == (count_keys(raw, enough) > enough)
