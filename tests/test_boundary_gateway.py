"""Request bodies at the agent gateway, hypothesis-generated: OpenAI Chat Completions, OpenAI
Responses and Anthropic Messages, streaming and not. A malformed body (a field of a valid body
replaced by a wrong type, a huge or negative number, a lone surrogate, an unknown role, a block of
the wrong shape; arbitrary JSON; bytes that are not JSON or not UTF-8) is answered with a 4xx in
that API's own error format naming the field -- never a 500, never a hang -- and leaves the
session as it was: no turn counted, no engine call, no token recorded. A body that happens to
be valid is processed (200)."""

from __future__ import annotations

import json
import math

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from slime.agent.gateway.server import Gateway
from slime.rollout.engine_client import EngineClient
from slime.testing.json_paths import paths_of, replaced
from slime.testing.scripted_engine import ScriptedEngine
from slime.utils.endpoints import Endpoints

SID = "victim"
TOOL_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
VALID = {
    "chat": {
        "model": "m",
        "max_tokens": 8,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["\n\n"],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "1"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": TOOL_SCHEMA}}],
    },
    "responses": {
        "model": "m",
        "max_output_tokens": 8,
        "temperature": 0.5,
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "1"},
        ],
        "tools": [{"type": "function", "name": "f", "description": "d", "parameters": TOOL_SCHEMA}],
    },
    "anthropic": {
        "model": "m",
        "max_tokens": 8,
        "temperature": 0.5,
        "top_k": 5,
        "system": "Be brief.",
        "stop_sequences": ["\n\n"],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "t", "signature": ""},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "1"}]},
        ],
        "tools": [{"name": "f", "description": "d", "input_schema": TOOL_SCHEMA}],
    },
}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "anthropic": "/v1/messages"}
APIS = sorted(PATHS)


@pytest.fixture(scope="module")
def gateway():
    from transformers import AutoTokenizer

    from slime.testing.tiny_model import qwen_tokenizer_dir

    model_dir = str(qwen_tokenizer_dir())
    tok = AutoTokenizer.from_pretrained(model_dir)
    answer = tok.encode("ok", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    engine = ScriptedEngine(lambda body: {"output_ids": answer, "finish_type": "stop"}, model_dir).start()
    client = EngineClient(Endpoints(engine.url, [engine.url]), tokenizer=tok, request_timeout=30.0, max_retries=0)
    gw = Gateway(client, tokenizer=tok).start()
    gw.scripted_engine = engine
    yield gw
    gw.stop()
    engine.stop()


def post(gw: Gateway, api: str, content: bytes, sid: str = SID) -> httpx.Response:
    """`content` sent to the session `sid`-`api` (opened on first use), with its key."""
    if f"{sid}-{api}" not in gw.sessions:
        gw.open_session(f"{sid}-{api}")
    return httpx.post(
        gw.url + PATHS[api],
        content=content,
        timeout=30.0,
        headers={"Content-Type": "application/json", "X-Session-Id": gw.session_key(f"{sid}-{api}")},
    )


def snapshot(gw: Gateway, api: str) -> tuple:
    """What a refused request must not change: the session's turns and answers sent, the trajectory's
    recorded turns, the engine calls made."""
    sid = f"{SID}-{api}"
    session = gw.sessions._sessions.get(sid)
    return (
        session.turns if session else 0,
        len(session.conversations) if session else 0,
        gw.manager.turn_count(sid),
        len(gw.scripted_engine.requests),
    )


def error_field(api: str, resp: httpx.Response) -> str:
    """The field an error names, after checking the body is that API's error shape."""
    body = resp.json()
    if api == "anthropic":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        assert body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
        assert body["error"]["param"] in (None, message.split(":")[0])
    return message.split(":")[0]


def assert_refused_or_served(gw: Gateway, api: str, body_bytes: bytes, named: str | None) -> int:
    before = snapshot(gw, api)
    resp = post(gw, api, body_bytes)
    assert resp.status_code == 200 or 400 <= resp.status_code < 500, resp.text
    if resp.status_code == 200:
        return 200
    field = error_field(api, resp)
    if named is not None:  # the field named is the one broken, or (a template's refusal) its list, or --
        # when a block's `type` changed -- a field that type requires in the same block
        block = named.rsplit(".", 1)[0] + "." if named.endswith(".type") else named
        assert named.startswith(field) or field.startswith(block), (named, resp.text)
    assert snapshot(gw, api) == before
    return resp.status_code


# ------------------------------------------------------------------ bodies with one field broken


def field_name(path: tuple) -> str:
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
    return out


bad_values = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(
        st.sampled_from(["type", "role", "text", "name", "x"]),
        st.one_of(st.integers(), st.text(max_size=5), st.none()),
        max_size=3,
    ),
    st.text(max_size=20).map(lambda s: s + "\ud800"),  # a lone surrogate: not encodable as UTF-8
    st.sampled_from(["", "narrator", "function_call", "image", "tool_use", "-1"]),
)


@st.composite
def broken_body(draw):
    api = draw(st.sampled_from(APIS))
    body = dict(VALID[api], stream=draw(st.booleans()))
    path = draw(st.sampled_from(paths_of(body)))
    return api, path, replaced(body, path, draw(bad_values))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=broken_body())
@example(case=("chat", ("messages", 1, "role"), replaced(VALID["chat"], ("messages", 1, "role"), "narrator")))
@example(case=("anthropic", ("max_tokens",), replaced(VALID["anthropic"], ("max_tokens",), -5)))
@example(
    case=("responses", ("tools", 0, "parameters"), replaced(VALID["responses"], ("tools", 0, "parameters"), [1, 2]))
)
def test_a_body_with_one_broken_field_is_refused_naming_it_or_served(gateway, case):
    api, path, body = case
    assert_refused_or_served(gateway, api, json.dumps(body).encode(), field_name(path))


BROKEN = [  # (api, path, value, the field the error names)
    ("chat", ("messages",), [], "messages"),
    ("chat", ("messages", 1, "role"), "narrator", "messages[1].role"),
    ("chat", ("messages", 1, "content"), 7, "messages[1].content"),
    ("chat", ("messages", 1, "content", 0), {"type": "text", "text": 3}, "messages[1].content[0].text"),
    ("chat", ("messages", 2, "tool_calls", 0, "function"), "f", "messages[2].tool_calls[0].function"),
    ("chat", ("max_tokens",), -1, "max_tokens"),
    ("chat", ("max_tokens",), 10**40, "max_tokens"),
    ("chat", ("temperature",), math.inf, "temperature"),
    ("chat", ("tools", 0, "function", "parameters"), "schema", "tools[0].function.parameters"),
    ("chat", ("messages", 1, "content", 0, "text"), "a\udc00b", "messages[1].content[0].text"),
    ("responses", ("input",), [], "input"),
    ("responses", ("input", 0, "role"), "narrator", "input[0].role"),
    ("responses", ("input", 1, "name"), None, "input[1].name"),
    ("responses", ("max_output_tokens",), 0, "max_output_tokens"),
    ("responses", ("instructions",), ["x"], "instructions"),
    ("anthropic", ("messages", 0, "role"), "tool", "messages[0].role"),
    ("anthropic", ("messages", 1, "content", 1, "input"), '{"a": 1}', "messages[1].content[1].input"),
    ("anthropic", ("messages", 2, "content", 0), "tool_result", "messages[2].content[0]"),
    ("anthropic", ("top_k",), 0, "top_k"),
    ("anthropic", ("temperature",), 1.5, "temperature"),
    ("anthropic", ("system",), {"text": "x"}, "system"),
    ("anthropic", ("tools", 0, "name"), "", "tools[0].name"),
]


@pytest.mark.parametrize("api,path,value,field", BROKEN)
def test_each_known_breakage_is_a_400_naming_its_field(gateway, api, path, value, field):
    stream = BROKEN.index((api, path, value, field)) % 2 == 1  # half of them streamed
    body = json.dumps(replaced(dict(VALID[api], stream=stream), path, value)).encode()
    before = snapshot(gateway, api)
    resp = post(gateway, api, body)
    assert resp.status_code == 400, resp.text
    assert error_field(api, resp) == field
    assert snapshot(gateway, api) == before


def test_the_valid_bodies_are_served_streamed_and_not(gateway):
    for api in APIS:
        for stream in (False, True):
            before = snapshot(gateway, api)
            resp = post(gateway, api, json.dumps(dict(VALID[api], stream=stream)).encode(), sid=f"ok{stream}")
            assert resp.status_code == 200, resp.text
            after = snapshot(gateway, api)
            assert after[:3] == before[:3] and after[3] == before[3] + 1  # another session's turn, one engine call
            assert gateway.manager.turn_count(f"ok{stream}-{api}") == 1


# ------------------------------------------------------------------ bodies that are not a request at all

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(api=st.sampled_from(APIS), value=json_values)
def test_arbitrary_json_is_refused_in_the_apis_error_format(gateway, api, value):
    status = assert_refused_or_served(gateway, api, json.dumps(value).encode(), None)
    assert status == 400


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(api=st.sampled_from(APIS), raw=st.binary(max_size=64))
@example(api="chat", raw=b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}')  # not UTF-8
@example(api="anthropic", raw=b"[" * 100_000)  # nested past any parser's recursion
@example(api="responses", raw=b"<html>nope</html>")
def test_bytes_that_are_not_a_json_request_are_refused(gateway, api, raw):
    try:
        json.loads(raw)
    except ValueError:
        pass
    except RecursionError:
        pass
    else:
        return  # valid JSON: covered by the test above
    status = assert_refused_or_served(gateway, api, raw, None)
    assert status == 400


def test_count_tokens_refuses_a_broken_body_in_anthropics_format(gateway):
    gateway.open_session("counting")
    url = gateway.base_url("counting", api="anthropic") + "/v1/messages/count_tokens"
    bad = httpx.post(url, json={"messages": [{"role": "narrator", "content": "x"}]}, timeout=30.0)
    assert bad.status_code == 400 and error_field("anthropic", bad) == "messages[0].role"
    deep = httpx.post(url, content=b"[" * 100_000, timeout=30.0)
    assert (
        deep.status_code == 400 and error_field("anthropic", deep) == "the request body is not JSON this server reads"
    )
    good = httpx.post(url, json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30.0)
    assert good.status_code == 200 and good.json()["input_tokens"] > 0


@pytest.mark.parametrize("api", ["chat", "anthropic"])
def test_slimes_aiohttp_adapters_refuse_the_same_bodies(gateway, api):
    """The compatibility adapters (slime's `BaseAdapter` on aiohttp) read bodies through the same checks."""
    from slime.agent.adapters.anthropic import AnthropicAdapter
    from slime.agent.adapters.openai import OpenAIAdapter
    from slime.agent.aiohttp_threaded import run_app_in_thread

    cls = AnthropicAdapter if api == "anthropic" else OpenAIAdapter
    adapter = cls(tokenizer=gateway.tokenizer, sglang_url=gateway.scripted_engine.url)
    handle = run_app_in_thread(adapter.app)
    base = f"http://127.0.0.1:{handle.port}"
    try:
        bad = replaced(VALID[api], ("messages", 0, "role"), "narrator")
        resp = httpx.post(base + PATHS[api], json=bad, timeout=30.0)
        assert resp.status_code == 400 and error_field(api, resp) == "messages[0].role"
        resp = httpx.post(base + PATHS[api], content=b"[" * 100_000, timeout=30.0)
        assert resp.status_code == 400 and error_field(api, resp) == "the body is not JSON"
        if api == "anthropic":
            resp = httpx.post(base + "/v1/messages/count_tokens", json=bad, timeout=30.0)
            assert resp.status_code == 400 and error_field(api, resp) == "messages[0].role"
        assert len(adapter.sessions) == 0 and adapter.manager.turn_count("default") == 0
    finally:
        handle.stop()
