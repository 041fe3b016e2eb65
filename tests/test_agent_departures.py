"""Partial answers and clients that leave, through the real gateway, the real sglang-router (or one
known engine) and scripted engines: an engine abort in the middle of an answer is a 503 the SDKs
retry and the partial answer is trained nowhere; a client that disconnects (streamed or not) gets
its engine request aborted on the engine that has it, and its turn is neither recorded nor counted
against the turn budget; a session finished under a turn answers that turn in its API's format."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import anthropic
import openai
import pytest

from slime.agent.gateway.server import Gateway
from slime.rollout.engine_client import EngineClient
from slime.testing.agent_stack import IM_END
from slime.testing.scripted_fleet import scripted_fleet
from slime.utils.endpoints import Endpoints
from slime.utils.types import Sample


@pytest.fixture(scope="module")
def tok(tiny_tokenizer):
    return tiny_tokenizer  # the session's (tests/conftest.py): loaded once


class Engine:
    """The engines' script: answers at once, or -- while `hold` is set -- waits for an abort (its
    client leaving, or `/abort_request`) and answers it with the tokens sampled so far, as SGLang
    does. `abort_after` makes the next answer an abort after that many tokens (a weight update)."""

    def __init__(self, tok) -> None:
        self.tok = tok
        self.hold = False
        self.abort_after: int | None = None
        self.arrived, self.aborted = threading.Event(), threading.Event()
        self.answers: list[tuple[list[int], list[float]]] = []

    async def __call__(self, body: dict, aborted: asyncio.Event) -> dict:
        ids = self.tok.encode(f"Answer {len(self.answers)}.", add_special_tokens=False)
        ids.append(self.tok.convert_tokens_to_ids(IM_END))
        log_probs = [-(len(self.answers) + 1) - i / 100 for i in range(len(ids))]
        self.answers.append((ids, log_probs))
        self.arrived.set()
        if self.hold:
            await aborted.wait()
            self.aborted.set()
            return {"output_ids": ids[:2], "finish_type": "abort", "log_probs": log_probs[:2]}
        if self.abort_after is not None:
            n, self.abort_after = self.abort_after, None
            return {"output_ids": ids[:n], "finish_type": "abort", "log_probs": log_probs[:n]}
        return {"output_ids": ids, "finish_type": "stop", "log_probs": log_probs}


@pytest.fixture(params=["router", "known_engine"])
def gateway(request, tok, tiny_model_dir):
    """A gateway on one scripted engine, reached through the router or directly (by its URL)."""
    engine = Engine(tok)
    with scripted_fleet([engine], tiny_model_dir) as (router, engines):
        front = router.url if request.param == "router" else engines[0].url
        client = EngineClient(Endpoints(front, [e.url for e in engines]), tokenizer=tok, request_timeout=60.0)
        gw = Gateway(client, tokenizer=tok).start()
        gw.engine_script, gw.engine_server, gw.via = engine, engines[0], request.param
        try:
            yield gw
        finally:
            engine.hold = False
            gw.stop()


def key_of(gw: Gateway, sid: str) -> str:
    """The session's key, opening the session on first use (the gateway refuses a session never opened)."""
    return gw.session_key(sid) if sid in gw.sessions else gw.open_session(sid)


def url_of(gw: Gateway, sid: str) -> str:
    key_of(gw, sid)
    return gw.base_url(sid)


def finish(gw: Gateway, sid: str, wait_timeout: float = 30.0) -> list[Sample]:
    return asyncio.run(gw.finish_session(sid, base_sample=Sample(index=0, prompt=""), wait_timeout=wait_timeout))


def trained(samples: list[Sample]) -> list[list[float]]:
    return [[lp for m, lp in zip(s.loss_mask, s.rollout_log_probs) if m] for s in samples]


def test_an_engine_abort_mid_answer_is_a_503_the_sdks_retry_and_the_partial_answer_is_not_trained(gateway):
    engine = gateway.engine_script
    engine.abort_after = 3
    msgs = [{"role": "user", "content": "hi"}]
    with openai.OpenAI(base_url=url_of(gateway, "abort-oa"), api_key="x", max_retries=2) as client:
        r = client.chat.completions.create(model="m", messages=msgs)
    assert r.choices[0].message.content == "Answer 1." and r.choices[0].finish_reason == "stop"
    [sample] = finish(gateway, "abort-oa")
    assert trained([sample]) == [engine.answers[1][1]]  # the retried answer; the 3 aborted tokens nowhere

    engine.abort_after = 2
    with anthropic.Anthropic(base_url=gateway.url, api_key=key_of(gateway, "abort-an"), max_retries=2) as client:
        with client.messages.stream(model="m", max_tokens=64, messages=msgs) as stream:
            final = stream.get_final_message()
    assert final.content[0].text == "Answer 3." and final.stop_reason == "end_turn"
    [sample] = finish(gateway, "abort-an")
    assert trained([sample]) == [engine.answers[3][1]]


def test_an_engine_abort_without_retries_is_a_503_in_each_apis_format(gateway):
    gateway.engine_script.abort_after = 1
    with openai.OpenAI(base_url=url_of(gateway, "abort-503"), api_key="x", max_retries=0) as client:
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 503 and e.value.body["type"] == "overloaded_error"
    assert finish(gateway, "abort-503") == []


def post_then_leave(gw: Gateway, sid: str, body: dict) -> None:
    """Send a chat request on a raw connection and close it once the engine has the request."""
    data = json.dumps(body).encode()
    head = (
        f"POST {gw.session_path(sid)}/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", gw.port), timeout=30) as s:
        s.sendall(head + data)
        assert gw.engine_script.arrived.wait(30), "the engine never got the turn"


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_aborts_its_engine_request_and_its_turn_is_not_recorded_or_counted(gateway, stream):
    engine, sid = gateway.engine_script, f"gone-{stream}"
    gateway.open_session(sid, max_turns=1)
    engine.hold = True
    post_then_leave(gateway, sid, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
    assert engine.aborted.wait(30), "the engine kept sampling for a client that left"
    session = gateway.sessions.get(sid)
    asyncio.run(session.drain(30))  # the cancelled turn has unwound (its abort sent before that)
    rid = gateway.engine_server.requests[0]["rid"]
    if gateway.via == "known_engine":  # one /abort_request, by rid, to the engine that had it
        assert gateway.engine_server.aborts == [{"rid": rid}]
    else:  # through the router its closed connection is the abort, on that engine only
        assert gateway.engine_server.aborts == [] and gateway.engine_server.disconnects == [rid]
    assert session.turns == 0
    engine.hold = False
    with openai.OpenAI(base_url=gateway.base_url(sid), api_key="x", max_retries=0) as client:
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])  # budget: 1
    assert r.choices[0].message.content == "Answer 1."
    [sample] = finish(gateway, sid)
    assert trained([sample]) == [engine.answers[1][1]]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_session_finished_under_a_turn_answers_it_in_its_apis_error_format(gateway, api):
    engine, sid = gateway.engine_script, f"finished-{api}"
    key = key_of(gateway, sid)
    engine.hold = True

    def ask():
        if api == "openai":
            with openai.OpenAI(base_url=gateway.base_url(sid), api_key="x", max_retries=0) as client:
                return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        with anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0) as client:
            return client.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}])

    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(ask)
        assert engine.arrived.wait(30)
        assert finish(gateway, sid, wait_timeout=0.2) == []  # gave up waiting: the turn is cancelled
        error = openai.APIStatusError if api == "openai" else anthropic.APIStatusError
        with pytest.raises(error) as e:
            answer.result(60)
    assert e.value.status_code == 503
    assert e.value.response.headers["content-type"].startswith("application/json")
    kind = e.value.body["type"] if api == "openai" else e.value.body["error"]["type"]
    assert kind == "overloaded_error" and "finished" in str(e.value.body)
    assert engine.aborted.wait(30)
