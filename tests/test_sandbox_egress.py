"""Issue 23, sandbox side: a session's one way out. From inside a session the real agent gateway (scripted
engines behind the real sglang-router) answers at the session's egress URL, streamed and not, and
records exactly what the engine sampled; a second host port, the sandbox server's own port, the
gateway's real port and any outside address stay unreachable; runs and sessions without an egress
have none. Also `--ro-bind` (tools visible read-only in every slot) and the start-time refusals."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
import requests

from tests.test_sandbox import ISOLATED

pytestmark = pytest.mark.skipif(not ISOLATED, reason="the egress needs namespaces/uid switching")

REPLY = "Hello from the engine."


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from transformers import AutoTokenizer

    from slime.sandbox.server import start_local_sandbox
    from slime.testing.agent_stack import AgentStack
    from slime.testing.ok_server import start_ok_server
    from slime.testing.tiny_model import qwen_tokenizer_dir
    from slime.utils.misc import find_free_port

    tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    stack = AgentStack(tok, qwen_tokenizer_dir(), lambda case, turn: REPLY).start()
    other = start_ok_server()
    tools = tmp_path_factory.mktemp("tools")
    tools.chmod(0o755)  # (the sandbox's uid must read it: the bind shows it with its own modes)
    (tools / "bin").mkdir()
    (tools / "bin" / "hello").write_text("#!/bin/sh\necho hello from the tools\n")
    (tools / "bin" / "hello").chmod(0o755)
    try:
        url, handle = start_local_sandbox(
            max_concurrency=2,
            extra_args=[
                "--egress",
                f"gateway=127.0.0.1:{stack.gateway.port}",
                "--max-egress-connections",
                "2",
                "--egress",
                f"dead=127.0.0.1:{find_free_port()}",
                "--ro-bind",
                f"{tools}:/opt/tools",
            ],
        )
    except BaseException:
        stack.stop()
        other.shutdown()
        other.server_close()
        raise
    yield {"url": url, "stack": stack, "other_port": other.server_address[1], "tools": tools}
    handle.stop()
    stack.stop()
    other.shutdown()
    other.server_close()


def _open(url: str, **body) -> dict:
    r = requests.post(f"{url}/sessions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _python(url: str, sid: str, code: str) -> dict:
    r = requests.post(
        f"{url}/sessions/{sid}/exec", json={"command": "python3 -", "stdin": code, "timeout": 60}, timeout=120
    )
    assert r.status_code == 200, r.text
    return r.json()


CHAT = """
import json, urllib.request
def post(body):
    req = urllib.request.Request("{base}/chat/completions", data=json.dumps(body).encode(),
                                 headers={{"content-type": "application/json"}})
    return urllib.request.urlopen(req, timeout=30).read().decode()
msgs = [{{"role": "user", "content": "case=egress hi"}}]
print(json.loads(post({{"model": "m", "messages": msgs, "max_tokens": 32}}))["choices"][0]["message"]["content"])
events = [l for l in post({{"model": "m", "messages": msgs, "max_tokens": 32, "stream": True}}).splitlines() if l]
print("".join(json.loads(e[6:])["choices"][0]["delta"].get("content") or ""
              for e in events if e != "data: [DONE]" and json.loads(e[6:])["choices"]), events[-1])
"""


def test_the_gateway_answers_inside_a_session_and_records_exactly_what_was_sampled(env):
    from slime.testing.agent_stack import assert_chain
    from slime.utils.types import Sample

    stack = env["stack"]
    s = _open(env["url"], egress="gateway")
    assert s["egress_url"] == "http://127.0.0.1:80"
    stack.gateway.open_session("eg-1")
    try:
        out = _python(
            env["url"], s["session_id"], CHAT.format(base=f"{s['egress_url']}{stack.gateway.session_path('eg-1')}/v1")
        )
        assert (out["returncode"], out["stdout"], out["stderr"]) == (0, f"{REPLY}\n{REPLY} data: [DONE]\n", "")
        counters = requests.get(f"{env['url']}/sessions/{s['session_id']}", timeout=10).json()["egress_counters"]
        assert (counters["connections"], counters["refused"], counters["failed"]) == (2, 0, 0)
        assert counters["bytes_out"] > 0 and counters["bytes_in"] > 0
    finally:
        requests.delete(f"{env['url']}/sessions/{s['session_id']}", timeout=60)
    bodies = stack.requests_of("egress")
    samples = asyncio.run(stack.gateway.finish_session("eg-1", base_sample=Sample(index=0, prompt=""), reward=1.0))
    assert len(bodies) == 2 and bodies[0]["input_ids"] == bodies[1]["input_ids"]
    answer = stack.answer(bodies[0])
    assert len(samples) == 2  # (the same prompt twice: two chains)
    for sample in samples:
        assert_chain(sample, [(bodies[0]["input_ids"], answer["output_ids"], answer["log_probs"])])


PROBE = """
import socket
for host, port in {targets}:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(5)
    try:
        s.connect((host, port))
        print(host, port, "connected")
    except OSError as e:
        print(host, port, e.errno)
"""


def test_nothing_but_the_egress_is_reachable_from_a_session(env):
    url, other, gw = env["url"], env["other_port"], env["stack"].gateway.port
    server = int(url.rsplit(":", 1)[1])
    assert requests.get(f"http://127.0.0.1:{other}/", timeout=10).text == "ok"  # (it is there, for the host)
    targets = [
        ("127.0.0.1", 80),
        ("127.0.0.1", other),
        ("127.0.0.1", server),
        ("127.0.0.1", gw),
        ("::1", other),
        ("8.8.8.8", 53),
        ("1.1.1.1", 443),
        ("10.0.0.1", 80),
        ("2001:4860:4860::8888", 53),
    ]
    sid = _open(url, egress="gateway")["session_id"]
    try:
        out = _python(url, sid, PROBE.format(targets=targets))
    finally:
        requests.delete(f"{url}/sessions/{sid}", timeout=60)
    refused, unreachable = 111, 101  # ECONNREFUSED, ENETUNREACH
    assert out["stdout"].splitlines() == [
        "127.0.0.1 80 connected",
        f"127.0.0.1 {other} {refused}",
        f"127.0.0.1 {server} {refused}",
        f"127.0.0.1 {gw} {refused}",
        f"::1 {other} {refused}",
        f"8.8.8.8 53 {unreachable}",
        f"1.1.1.1 443 {unreachable}",
        f"10.0.0.1 80 {unreachable}",
        f"2001:4860:4860::8888 53 {unreachable}",
    ]


def test_runs_and_sessions_without_an_egress_have_no_way_out(env):
    url = env["url"]
    code = PROBE.format(targets=[("127.0.0.1", 80), ("127.0.0.1", env["stack"].gateway.port)])
    sid = _open(url)["session_id"]
    try:
        assert _python(url, sid, code)["stdout"] == f"127.0.0.1 80 111\n127.0.0.1 {env['stack'].gateway.port} 111\n"
    finally:
        requests.delete(f"{url}/sessions/{sid}", timeout=60)
    run = requests.post(f"{url}/run_code", json={"code": code}, timeout=60).json()
    assert run["run_result"]["stdout"] == f"127.0.0.1 80 111\n127.0.0.1 {env['stack'].gateway.port} 111\n"


HOLD = """
import socket
held = [socket.create_connection(("127.0.0.1", 80), timeout=5) for _ in range(3)]
held[2].settimeout(5)
print(held[2].recv(10))  # (the third: over the cap, closed by the server at once)
"""


def test_egress_connections_are_capped_and_counted(env):
    url = env["url"]
    sid = _open(url, egress="gateway")["session_id"]
    try:
        out = _python(url, sid, HOLD)
        assert (out["returncode"], out["stdout"]) == (0, "b''\n")
        counters = requests.get(f"{url}/sessions/{sid}", timeout=10).json()["egress_counters"]
        assert (counters["connections"], counters["refused"]) == (2, 1)
    finally:
        requests.delete(f"{url}/sessions/{sid}", timeout=60)


def test_an_egress_whose_target_is_down_closes_each_connection_and_counts_it(env):
    url = env["url"]
    sid = _open(url, egress="dead")["session_id"]
    try:
        out = _python(
            url,
            sid,
            "import socket\ns = socket.create_connection(('127.0.0.1', 80), timeout=5)\n"
            "s.settimeout(15)\nprint(s.recv(10))",
        )
        assert (out["returncode"], out["stdout"]) == (0, "b''\n")
        counters = requests.get(f"{url}/sessions/{sid}", timeout=10).json()["egress_counters"]
        assert (counters["connections"], counters["failed"], counters["bytes_out"]) == (0, 1, 0)
    finally:
        requests.delete(f"{url}/sessions/{sid}", timeout=60)


def test_ro_bind_shows_tools_read_only_in_runs_and_sessions(env):
    url = env["url"]
    sid = _open(url)["session_id"]
    try:
        r = requests.post(
            f"{url}/sessions/{sid}/exec",
            timeout=60,
            json={
                "command": "/opt/tools/bin/hello; touch /opt/tools/x; grep ' /opt/tools ' /proc/self/mountinfo | "
                "grep -o 'ro,nosuid,nodev'"
            },
        ).json()
        assert r["stdout"] == "hello from the tools\nro,nosuid,nodev\n"
        assert r["stderr"] == "touch: cannot touch '/opt/tools/x': Read-only file system\n"
    finally:
        requests.delete(f"{url}/sessions/{sid}", timeout=60)
    run = requests.post(f"{url}/run_code", json={"code": "/opt/tools/bin/hello", "language": "bash"}, timeout=60)
    assert run.json()["run_result"]["stdout"] == "hello from the tools\n"
    assert sorted(os.listdir(env["tools"])) == ["bin"]
    health = requests.get(f"{url}/health", timeout=10).json()
    assert (health["egress"], health["ro_binds"], health["max_sessions"]) == (["dead", "gateway"], ["/opt/tools"], 2)


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--ro-bind", "/nonexistent/clis"],
            "--ro-bind '/nonexistent/clis': the host path '/nonexistent/clis' does not exist",
        ),
        (
            ["--ro-bind", "/usr/share:/tmp"],
            "--ro-bind '/usr/share:/tmp': '/tmp' would hide /tmp, which the sandbox "
            "makes itself; bind below it (e.g. /tmp/..., /opt/...)",
        ),
        (
            ["--ro-bind", "/usr/share:opt"],
            "--ro-bind '/usr/share:opt': the path inside ('opt') must be absolute and not /",
        ),
        (["--egress", "gateway"], "--egress 'gateway': expected NAME=HOST:PORT (e.g. gateway=127.0.0.1:8000)"),
        (["--egress", "a=h:1", "--egress", "a=h:2"], "--egress 'a=h:2': the name 'a' is given twice"),
        (["--egress-port", "0"], "--egress-port: must be a TCP port (1-65535), got 0"),
        (["--egress-port", "65536"], "--egress-port: must be a TCP port (1-65535), got 65536"),
        (["--max-egress-connections", "0"], "--max-egress-connections: must be >= 1, got 0"),
    ],
)
def test_bad_egress_and_ro_bind_flags_refuse_the_start(flags, message, capsys):
    from slime.sandbox.server import main

    with pytest.raises(SystemExit) as e:
        main(flags)
    assert e.value.code == 2
    assert capsys.readouterr().err == f"slime-sandbox: refusing to start: {message}\n"


def test_egress_targets_parse_names_hosts_and_ports():
    from slime.sandbox.egress import parse_egress_targets

    assert parse_egress_targets(["gateway=127.0.0.1:8000", "v6=[::1]:9"]) == {
        "gateway": ("127.0.0.1", 8000),
        "v6": ("::1", 9),
    }
    assert json.dumps(parse_egress_targets([])) == "{}"
