"""Issue 29, session credentials: a session is reached only with its key, a secret `open_session`
mints and the host gives to that session's agent alone. A request naming another session -- its id
in the URL, in `X-Session-Id`, as the API key or in the body, with or without the requester's own
key -- or a session never opened is refused (401 in that API's own error format), reaches no
engine, opens no session and leaves the victim's trajectory as it was. Ids in URLs are encoded.
The same holds from inside our sandbox, through its one egress, for an agent run by `CommandAgent`
(its env holds its own key only). slime's adapters keep slime's contract (the key is the sid
unless `open_session(key=...)`), without opening a session for an unknown key."""

from __future__ import annotations

import asyncio
import json
import secrets
from urllib.parse import quote

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.utils.types import Sample

VICTIM = "agent-4242-0-0"  # a rollout sid as `slime.agent.rollout.session_id` names one: guessable
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "anthropic": "/v1/messages"}


def body(api: str, text: str) -> dict:
    if api == "responses":
        return {"model": "m", "input": text, "max_output_tokens": 8}
    return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 8}


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from slime.testing.tiny_model import qwen_tokenizer_dir

    return AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))


@pytest.fixture(scope="module")
def engine(tok):
    from slime.testing.scripted_engine import ScriptedEngine
    from slime.testing.tiny_model import qwen_tokenizer_dir

    answer = tok.encode("ok", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    e = ScriptedEngine(lambda b: {"output_ids": answer, "finish_type": "stop"}, str(qwen_tokenizer_dir())).start()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def gw(tok, engine):
    from slime.agent.gateway.server import Gateway
    from slime.rollout.engine_client import EngineClient
    from slime.utils.endpoints import Endpoints

    client = EngineClient(Endpoints(engine.url, [engine.url]), tokenizer=tok, request_timeout=30.0, max_retries=0)
    g = Gateway(client, tokenizer=tok).start()
    yield g
    g.stop()


def finish(gw, sid: str) -> list[Sample]:
    return asyncio.run(gw.finish_session(sid, base_sample=Sample(index=0, prompt=""), reward=1.0))


def texts_sent(engine, tok) -> list[str]:
    return [tok.decode(r["input_ids"]) for r in engine.requests]


def session_url(gw, sid: str, api: str) -> str:
    """Where an SDK given `base_url(sid, ...)` posts (OpenAI's base ends in /v1, Anthropic's does not)."""
    if api == "anthropic":
        return gw.base_url(sid, "anthropic") + PATHS[api]
    return gw.base_url(sid) + PATHS[api].removeprefix("/v1")


def attacks(gw, api: str, own_key: str) -> dict[str, tuple[str, dict, dict]]:
    """Every way a request could name the victim's session: (url, headers, body)."""
    root, path = gw.url, PATHS[api]
    b = body(api, "case=intruder write this into the victim's sample")
    meta = {**b, "metadata": {"session_id": VICTIM}, "user": VICTIM} if api != "anthropic" else b
    return {
        "victim id in the URL": (f"{root}/s/{VICTIM}{path}", {}, b),
        "victim id in the URL, own key as API key": (
            f"{root}/s/{VICTIM}{path}",
            {"Authorization": f"Bearer {own_key}"},
            b,
        ),
        "victim id in X-Session-Id": (root + path, {"X-Session-Id": VICTIM}, b),
        "victim id in X-Session-Id, own key as API key": (
            root + path,
            {"X-Session-Id": VICTIM, "Authorization": f"Bearer {own_key}"},
            b,
        ),
        "victim id as bearer API key": (root + path, {"Authorization": f"Bearer {VICTIM}"}, b),
        "victim id as x-api-key": (root + path, {"x-api-key": VICTIM}, b),
        "victim id in the body only": (root + path, {}, meta),
        "victim id percent-encoded in the URL": (f"{root}/s/{quote(VICTIM + '/', safe='')}{path}", {}, b),
        "no key at all": (root + path, {}, b),
        "a guessed key": (root + path, {"Authorization": f"Bearer {secrets.token_urlsafe(32)}"}, b),
    }


def assert_refused_in_the_apis_format(api: str, resp: httpx.Response) -> None:
    """401 (no open session's key), or 404 for a path no route serves (an encoded '/' in the key)."""
    assert resp.status_code in (401, 404), (resp.status_code, resp.text)
    kind = "authentication_error" if resp.status_code == 401 else "not_found_error"
    err = resp.json()
    if api == "anthropic":
        assert err["type"] == "error" and err["error"]["type"] == kind
    else:
        assert err["error"]["type"] == kind
        assert err["error"]["code"] == ("invalid_api_key" if resp.status_code == 401 else None)
    assert VICTIM not in resp.text, "a refusal must not confirm which sessions exist"


@pytest.mark.parametrize("api", sorted(PATHS))
def test_no_request_without_the_victims_key_reaches_its_session(gw, engine, tok, api):
    victim, intruder = f"{VICTIM}", f"intruder-{api}"
    victim_key, own_key = gw.open_session(victim), gw.open_session(intruder)
    ok = httpx.post(session_url(gw, victim, api), json=body(api, f"case=victim-{api} hello"), timeout=30)
    assert ok.status_code == 200, ok.text
    sessions, calls = len(gw.sessions), len(engine.requests)

    for name, (url, headers, b) in attacks(gw, api, own_key).items():
        resp = httpx.post(url, json=b, headers=headers, timeout=30)
        assert_refused_in_the_apis_format(api, resp)
    assert len(gw.sessions) == sessions, "a request must never open a session"
    assert len(engine.requests) == calls, "a refused request reaches no engine"

    [sample] = finish(gw, victim)
    assert "intruder" not in tok.decode(sample.tokens) and f"case=victim-{api}" in tok.decode(sample.tokens)
    assert finish(gw, intruder) == []
    assert victim_key != own_key and len(victim_key) >= 43


def test_a_key_from_a_finished_session_is_refused_as_closed_and_count_tokens_needs_a_key(gw, engine):
    key = gw.open_session("short-lived")
    finish(gw, "short-lived")
    late = httpx.post(
        f"{gw.url}/v1/chat/completions", json=body("chat", "hi"), headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    assert late.status_code == 503 and "closed" in late.json()["error"]["message"]
    counted = httpx.post(f"{gw.url}/v1/messages/count_tokens", json=body("anthropic", "hi"), timeout=30)
    assert counted.status_code == 401 and counted.json()["error"]["type"] == "authentication_error"


ODD_IDS = ["a/b", "a b", "ü-ß", "?x=1", "#frag", "%2F", "..", "a%20b", "x" * 300]


def test_odd_session_ids_reach_their_own_session_through_base_url(gw, engine, tok):
    import openai

    for i, sid in enumerate(ODD_IDS):
        gw.open_session(sid)
        with openai.OpenAI(base_url=gw.base_url(sid), api_key="unused", max_retries=0) as client:
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"case=odd-{i}"}])
        assert r.choices[0].message.content == "ok"
        [sample] = finish(gw, sid)
        assert f"case=odd-{i}" in tok.decode(sample.tokens)


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.none(), st.text(max_size=60)))
def test_any_string_that_is_not_an_open_sessions_key_is_refused_and_opens_nothing(credential):
    from slime.agent.gateway.errors import SessionKeyError
    from slime.agent.gateway.session import SessionTable

    table = SessionTable()
    table.open("s-1", key=secrets.token_urlsafe(32))
    table.open("s-2")  # slime's adapters: the sid is the key
    if credential == "s-2":
        assert table.by_key(credential).sid == "s-2"
        return
    with pytest.raises(SessionKeyError):
        table.by_key(credential)
    assert len(table) == 2


def test_slimes_adapter_keeps_sid_keys_refuses_unknown_ones_and_takes_a_minted_key(engine, tok):
    from slime.agent.adapters import OpenAIAdapter
    from slime.agent.aiohttp_threaded import run_app_in_thread

    adapter = OpenAIAdapter(tokenizer=tok, sglang_url=engine.url)
    handle = run_app_in_thread(adapter.app, host="127.0.0.1", port=0, thread_name="test-keys-adapter")
    url = f"http://127.0.0.1:{handle.port}/v1/chat/completions"
    try:
        assert adapter.open_session("sid-a") == "sid-a"
        secret = adapter.open_session("sid-b", key=secrets.token_urlsafe(32))

        def post(key: str | None, text: str) -> httpx.Response:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            return httpx.post(url, json=body("chat", text), headers=headers, timeout=30)

        assert post("sid-a", "case=adapter-a").status_code == 200
        for key in ("never-opened", None, "sid-b"):
            refused = post(key, "case=adapter-intruder")
            assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        assert post(secret, "case=adapter-b").status_code == 200
        assert len(adapter.sessions) == 2
        a = asyncio.run(adapter.finish_session("sid-a", base_sample=Sample(index=0, prompt="")))
        b = asyncio.run(adapter.finish_session("sid-b", base_sample=Sample(index=0, prompt="")))
    finally:
        handle.stop()
    assert "case=adapter-a" in tok.decode(a[0].tokens) and "case=adapter-b" in tok.decode(b[0].tokens)
    assert not any("adapter-intruder" in t for t in texts_sent(engine, tok))


# ---------------------------------------------------------------- from inside the sandbox

ATTACK_SCRIPT = r"""
import json, os, urllib.error, urllib.request
base, key, victim = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["VICTIM"]
root = base.split("/s/")[0]
body = json.dumps({"model": "m", "max_tokens": 8,
                   "messages": [{"role": "user", "content": "case=sandbox-intruder take over"}]}).encode()

def post(url, headers):
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code

chat, msgs = "/v1/chat/completions", "/v1/messages"
tries = [("url", root + "/s/" + victim + chat, {}),
         ("url+own key", root + "/s/" + victim + chat, {"Authorization": "Bearer " + key}),
         ("header", root + chat, {"X-Session-Id": victim}),
         ("header+own key", root + chat, {"X-Session-Id": victim, "Authorization": "Bearer " + key}),
         ("bearer", root + chat, {"Authorization": "Bearer " + victim}),
         ("x-api-key", root + msgs, {"x-api-key": victim}),
         ("none", root + chat, {}),
         ("own", base + "/chat/completions", {})]
print(json.dumps({name: post(url, h) for name, url, h in tries}))
"""


@pytest.fixture(scope="module")
def sandbox_url(gw):
    from tests.test_sandbox import ISOLATED

    if not ISOLATED:
        pytest.skip("the egress needs namespaces/uid switching")
    from slime.sandbox.server import start_local_sandbox

    url, handle = start_local_sandbox(max_concurrency=2, extra_args=["--egress", f"gateway=127.0.0.1:{gw.port}"])
    yield url
    handle.stop()


def test_an_agent_inside_the_sandbox_reaches_only_its_own_session_through_the_egress(gw, engine, tok, sandbox_url):
    from slime.agent.sandboxes.command_agent import CommandAgent, CommandAgentConfig
    from slime.agent.sandboxes.sandbox_pool import SandboxPool
    from slime.agent.sandboxes.sandbox_slime import SlimeSandbox

    victim, attacker = "agent-4242-0-0", "agent-4242-1-1"
    gw.open_session(victim)
    ok = httpx.post(gw.base_url(victim) + "/chat/completions", json=body("chat", "case=sb-victim hi"), timeout=30)
    assert ok.status_code == 200
    key = gw.open_session(attacker)
    pool = SandboxPool(
        lambda egress: SlimeSandbox(sandbox_url, egress=egress, env={"VICTIM": victim}),
        concurrency=1,
        cluster_wide=False,
    )
    agent = CommandAgent(CommandAgentConfig(command="python3 attack.py", timeout=120), pool)
    sample = Sample(index=1, prompt="p", metadata={"files": {"attack.py": ATTACK_SCRIPT}})
    outcome = asyncio.run(agent.run(sample, session_key=key, base_path=gw.session_path(attacker)))
    assert outcome.metadata["agent_exit_code"] == 0, outcome.metadata["agent_output"]
    statuses = json.loads(outcome.metadata["agent_output"].strip().splitlines()[-1])
    assert statuses.pop("own") == 200, "the agent's own key works"
    assert statuses == dict.fromkeys(statuses, 401) and len(statuses) == 7

    [victims] = finish(gw, victim)
    assert "intruder" not in tok.decode(victims.tokens) and "case=sb-victim" in tok.decode(victims.tokens)
    [own] = finish(gw, attacker)
    assert "case=sandbox-intruder" in tok.decode(own.tokens)
    assert sum("sandbox-intruder" in t for t in texts_sent(engine, tok)) == 1, "only its own turn reached the engine"


SEGMENTS = st.one_of(
    st.sampled_from(
        ["s", "v1", "chat", "completions", "responses", "messages", "count_tokens", "models", "health", ""]
    ),
    st.text(max_size=6),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(SEGMENTS, max_size=6), st.booleans())
def test_a_turn_route_and_its_key_are_found_as_fastapis_router_finds_them(gw, segments, slash):
    """The gateway serves turns past FastAPI's routing (`AgentRoutes`): any path reaches a turn's
    endpoint, with the key FastAPI's `/s/{key}` would read, exactly when FastAPI routes it there."""
    from starlette.routing import Match

    path = "/" + "/".join(segments) + ("/" if slash else "")
    want = (None, None)
    for route in gw.app.routes:
        match, child = route.matches({"type": "http", "method": "POST", "path": path, "root_path": ""})
        if match is Match.FULL:
            if getattr(route.endpoint, "route_path", None) is not None:
                want = route.endpoint, child.get("path_params", {}).get("key")
            break
    assert gw.asgi.route(path) == want
