"""The agent gateway with clients nobody here wrote (the `openai`, `anthropic` and `openai-agents`
packages) against scripted engines behind the real sglang-router: every session completes, and
its recorded trajectory holds exactly the ids the engines sampled (mask 1, their log-probs and
weight version) with every template, tool and user delta masked 0."""

from __future__ import annotations

import asyncio
import json

import anthropic
import openai
import pytest

from slime.agent.gateway.server import GatewayConfig
from slime.testing.agent_stack import AgentStack, assert_chain
from slime.utils.types import Sample

CALL_ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
REPLIES = {"tool": [CALL_ADD, "3 + 4 = 7."], "chat": ["Hello there.", "Still here.", "Bye."], "long": ["x " * 30]}


def replies(case: str, turn: int) -> str:
    script = REPLIES[case.split("-")[0]]
    return script[min(turn, len(script) - 1)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = AgentStack.started_on_tiny_qwen(
        replies, config=GatewayConfig(max_context_tokens=256), log_dir=str(tmp_path_factory.mktemp("router"))
    )
    yield s
    s.stop()


def finish(stack, sid: str, reward: float = 1.0) -> list[Sample]:
    return asyncio.run(stack.gateway.finish_session(sid, base_sample=Sample(index=0, prompt="p"), reward=reward))


def assert_token_exact(stack, sample: Sample, bodies: list[dict]) -> None:
    """`sample` is the chain of these engine requests (see `assert_chain`)."""
    answers = [stack.answer(b) for b in bodies]
    assert_chain(sample, [(b["input_ids"], a["output_ids"], a["log_probs"]) for b, a in zip(bodies, answers)])
    assert sample.weight_versions == ["default"] * len(bodies)


def test_openai_sdk_tool_loop_records_exactly_the_sampled_tokens(stack):
    msgs = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "case=tool-oa 3+4?"}]
    stack.gateway.open_session("oa-1")
    with openai.OpenAI(base_url=stack.gateway.base_url("oa-1"), api_key="unused", max_retries=0) as client:
        r1 = client.chat.completions.create(model="m", messages=msgs, tools=[ADD_TOOL], max_tokens=64)
        call = r1.choices[0].message.tool_calls[0]
        assert (r1.choices[0].finish_reason, call.function.name) == ("tool_calls", "add")
        assert json.loads(call.function.arguments) == {"a": 3, "b": 4}
        msgs += [
            r1.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "7"},
        ]
        chunks = list(client.chat.completions.create(model="m", messages=msgs, tools=[ADD_TOOL], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "3 + 4 = 7."
    assert chunks[-1].choices[0].finish_reason == "stop"

    bodies = stack.requests_of("tool-oa")
    [sample] = finish(stack, "oa-1")
    assert_token_exact(stack, sample, bodies)
    delta = bodies[1]["input_ids"][len(bodies[0]["input_ids"]) + len(stack.answer(bodies[0])["output_ids"]) :]
    assert (
        stack.tok.decode(delta) == "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert sample.metadata["use_tool"] is True and sample.reward == 1.0


def test_anthropic_sdk_tool_use_round_trip_streamed_and_not(stack):
    tools = [{"name": "add", "description": "Add two integers.", "input_schema": ADD_TOOL["function"]["parameters"]}]
    msgs = [{"role": "user", "content": "case=tool-an 3+4?"}]
    key = stack.gateway.open_session("an-1")
    with anthropic.Anthropic(base_url=stack.gateway.url, api_key=key, max_retries=0) as client:
        m1 = client.messages.create(model="m", max_tokens=64, system="You add numbers.", messages=msgs, tools=tools)
        [use] = [b for b in m1.content if b.type == "tool_use"]
        assert (m1.stop_reason, use.name, use.input) == ("tool_use", "add", {"a": 3, "b": 4})
        msgs += [
            {"role": "assistant", "content": [b.model_dump() for b in m1.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "7"}]},
        ]
        with client.messages.stream(
            model="m", max_tokens=64, system="You add numbers.", messages=msgs, tools=tools
        ) as stream:
            final = stream.get_final_message()
    assert [b.text for b in final.content] == ["3 + 4 = 7."] and final.stop_reason == "end_turn"

    bodies = stack.requests_of("tool-an")
    [sample] = finish(stack, "an-1")
    assert_token_exact(stack, sample, bodies)


def test_openai_responses_api_function_call_round_trip(stack):
    tools = [
        {
            "type": "function",
            "name": "add",
            "description": "Add two integers.",
            "parameters": ADD_TOOL["function"]["parameters"],
        }
    ]
    items: list = [{"role": "user", "content": "case=tool-rs 3+4?"}]
    stack.gateway.open_session("rs-1")
    with openai.OpenAI(base_url=stack.gateway.base_url("rs-1"), api_key="unused", max_retries=0) as client:
        r1 = client.responses.create(model="m", instructions="You add numbers.", input=items, tools=tools)
        [call] = [o for o in r1.output if o.type == "function_call"]
        assert (call.name, json.loads(call.arguments)) == ("add", {"a": 3, "b": 4})
        items += [o.model_dump(exclude_none=True) for o in r1.output]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "7"})
        with client.responses.stream(model="m", instructions="You add numbers.", input=items, tools=tools) as stream:
            final = stream.get_final_response()
    assert final.output_text == "3 + 4 = 7." and final.status == "completed"

    bodies = stack.requests_of("tool-rs")
    [sample] = finish(stack, "rs-1")
    assert_token_exact(stack, sample, bodies)


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_agents_sdk_runs_a_tool_agent_through_the_gateway(stack, api):
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # no trace upload to api.openai.com

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    sid, case = f"ag-{api}", f"tool-ag{api}"
    stack.gateway.open_session(sid)

    async def run_agent():
        """On a loop of its own that `asyncio.run` closes, with the client closed on it first
        (`Runner.run_sync` would leave its loop, and the client's connection on it, open)."""
        async with openai.AsyncOpenAI(base_url=stack.gateway.base_url(sid), api_key="unused", max_retries=0) as client:
            model_class = OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel
            agent = Agent(
                name="adder",
                instructions="You add numbers.",
                tools=[add],
                model=model_class(model="m", openai_client=client),
            )
            return await Runner.run(agent, f"case={case} 3+4?")

    result = asyncio.run(run_agent())
    assert result.final_output == "3 + 4 = 7."

    bodies = stack.requests_of(case)
    [sample] = finish(stack, sid)
    assert len(bodies) == 2
    assert_token_exact(stack, sample, bodies)


def test_a_session_is_named_by_its_key_in_the_url_a_header_or_the_api_key(stack):
    gw = stack.gateway
    keys = {sid: gw.open_session(sid) for sid in ("s-url", "s-header", "s-key")}
    by_url = dict(base_url=gw.base_url("s-url"), api_key="other")
    by_header = dict(base_url=f"{gw.url}/v1", api_key="other", default_headers={"X-Session-Id": keys["s-header"]})
    by_key = dict(base_url=f"{gw.url}/v1", api_key=keys["s-key"])
    for named, case in ((by_url, "chat-u"), (by_header, "chat-h"), (by_key, "chat-k")):
        with openai.OpenAI(**named, max_retries=0) as client:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"case={case} hi"}])
    for sid, case in (("s-url", "chat-u"), ("s-header", "chat-h"), ("s-key", "chat-k")):
        [sample] = finish(stack, sid)
        assert_token_exact(stack, sample, stack.requests_of(case))
    assert finish(stack, "other") == []


def test_over_long_prompts_are_refused_in_each_apis_own_error_format(stack):
    gw = stack.gateway
    gw.open_session("too-long", max_context_tokens=8)
    long = [{"role": "user", "content": "case=chat-x " + "word " * 20}]
    before = len(stack.requests)
    with openai.OpenAI(base_url=gw.base_url("too-long"), api_key="x", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as oa:
            client.chat.completions.create(model="m", messages=long)
        assert oa.value.code == "context_length_exceeded" and "--rollout-max-context-len" in oa.value.message
        with pytest.raises(openai.BadRequestError) as rs:
            client.responses.create(model="m", input=long[0]["content"])
        assert rs.value.code == "context_length_exceeded"
    with anthropic.Anthropic(base_url=gw.base_url("too-long", api="anthropic"), api_key="x", max_retries=0) as client:
        with pytest.raises(anthropic.BadRequestError) as an:
            client.messages.create(model="m", max_tokens=8, messages=long)
    assert an.value.body["error"]["type"] == "invalid_request_error"
    assert an.value.body["error"]["message"].startswith("prompt is too long:")
    assert len(stack.requests) == before, "a refused prompt must not reach the engines"
    assert finish(stack, "too-long") == []


def test_an_edited_history_forks_a_second_sample_and_later_turns_cost_one_delta(stack):
    gw = stack.gateway
    msgs = [{"role": "user", "content": "case=chat-f hi"}]
    renders = gw.pipeline.renderer.full_renders
    gw.open_session("fork-1")
    with openai.OpenAI(base_url=gw.base_url("fork-1"), api_key="x", max_retries=0) as client:
        for _ in range(3):
            r = client.chat.completions.create(model="m", messages=msgs)
            msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
        assert gw.pipeline.renderer.full_renders == renders + 1, "turns 2 and 3 must append a delta, not re-render"
        compacted = [{"role": "user", "content": "case=chat-f summary of before"}]
        client.chat.completions.create(model="m", messages=compacted)

    bodies = stack.requests_of("chat-f")
    samples = finish(stack, "fork-1")
    assert len(samples) == 2
    assert_token_exact(stack, samples[0], bodies[:3])
    assert_token_exact(stack, samples[1], bodies[3:])


def test_a_turn_cut_at_max_tokens_is_reported_as_length_and_the_sample_truncated(stack):
    stack.gateway.open_session("len-1")
    with openai.OpenAI(base_url=stack.gateway.base_url("len-1"), api_key="x", max_retries=0) as client:
        r = client.chat.completions.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "case=long"}])
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    [sample] = finish(stack, "len-1")
    assert sample.status == Sample.Status.TRUNCATED and sample.metadata["truncated"] is True
    assert_token_exact(stack, sample, stack.requests_of("long"))


# ---------------------------------------------------------------- slime.agent.rollout.generate


def adder_agent(base_url: str, api_key: str, sample: Sample) -> float:
    """An agent as a user writes one: the OpenAI SDK, a tool loop, its own reward."""
    msgs = [{"role": "user", "content": sample.prompt}]
    with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        r = client.chat.completions.create(model="m", messages=msgs, tools=[ADD_TOOL])
        call = r.choices[0].message.tool_calls[0]
        args = json.loads(call.function.arguments)
        msgs += [
            r.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])},
        ]
        r = client.chat.completions.create(model="m", messages=msgs, tools=[ADD_TOOL])
    return 1.0 if r.choices[0].message.content == "3 + 4 = 7." else 0.0


async def crashing_agent(base_url: str, api_key: str, sample: Sample) -> float:
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": sample.prompt}])
        raise RuntimeError("the agent's tool server is down")


def silent_agent(base_url: str, api_key: str, sample: Sample) -> float:
    return 1.0


@pytest.fixture
def agent_args(stack):
    import argparse

    from slime.agent.flags import agent_defaults
    from slime.testing.runtime import bind_runtime
    from slime.tools.flags import tool_defaults

    args = argparse.Namespace(
        **{
            **agent_defaults(),
            **tool_defaults(),
            "sglang_router_ip": "127.0.0.1",
            "sglang_router_port": stack.router.port,
            "hf_checkpoint": stack.model_dir,
            "sglang_server_concurrency": 16,
            "rollout_max_context_len": None,
            "request_timeout": 30.0,
            "request_max_retries": 0,
        }
    )
    runtime = bind_runtime(args, tokenizer=stack.tok, engine_urls=[e.url for e in stack.engines])
    yield args
    from slime.agent.rollout import GATEWAY_KEY

    gateway = runtime.shared(GATEWAY_KEY, lambda: None)  # None when the test never started one
    if gateway is not None:
        gateway.stop()


def test_the_rollout_function_runs_an_sdk_agent_and_returns_its_token_exact_sample(stack, agent_args):
    from slime.agent.rollout import generate

    agent_args.agent_entry = "tests.test_agent_gateway.adder_agent"
    base = Sample(index=3, group_index=1, prompt="case=tool-ro 3+4?")
    [sample] = asyncio.run(generate(agent_args, base, {"max_new_tokens": 64}))
    assert (sample.reward, sample.index, sample.group_index, sample.session_id) == (1.0, 3, 1, base.session_id)
    assert_token_exact(stack, sample, stack.requests_of("tool-ro"))


def test_an_agent_that_crashes_keeps_its_turns_and_one_that_never_speaks_fails_its_sample(stack, agent_args):
    from slime.agent.rollout import generate

    agent_args.agent_entry = "tests.test_agent_gateway.crashing_agent"
    [crashed] = asyncio.run(generate(agent_args, Sample(index=4, prompt="case=chat-crash go"), {}))
    assert crashed.reward is None, "no reward from the agent: the reward model scores it"
    assert crashed.metadata["agent_error"] == "RuntimeError: the agent's tool server is down"
    assert_token_exact(stack, crashed, stack.requests_of("chat-crash"))

    agent_args.agent_entry = "tests.test_agent_gateway.silent_agent"
    silent = asyncio.run(generate(agent_args, Sample(index=5, prompt="nothing"), {}))
    assert silent.status == Sample.Status.FAILED and silent.metadata["failure_reason"] == "agent_session_empty"
    assert silent.response_length == 0 and silent.tokens == stack.tok("nothing", add_special_tokens=False)["input_ids"]


def test_a_session_past_its_turn_budget_or_closed_is_refused_in_the_clients_format(stack):
    gw = stack.gateway
    gw.open_session("cap-1", max_turns=1)
    openai_url = gw.base_url("cap-1")  # (the straggler below keeps the key of the session it had)
    msgs = [{"role": "user", "content": "case=chat-cap hi"}]
    with anthropic.Anthropic(base_url=gw.base_url("cap-1", api="anthropic"), api_key="x", max_retries=0) as client:
        client.messages.create(model="m", max_tokens=16, messages=msgs)
        with pytest.raises(anthropic.RateLimitError) as capped:
            client.messages.create(model="m", max_tokens=16, messages=msgs)
    assert "--agent-max-turns" in capped.value.body["error"]["message"]
    [sample] = finish(stack, "cap-1")
    assert_token_exact(stack, sample, stack.requests_of("chat-cap"))
    with (
        openai.OpenAI(base_url=openai_url, api_key="x", max_retries=0) as client,
        pytest.raises(openai.InternalServerError) as closed,
    ):  # a straggler after the sample was built
        client.chat.completions.create(model="m", messages=msgs)
    assert closed.value.status_code == 503 and "closed" in closed.value.message


def test_malformed_requests_are_refused_before_any_engine_call_naming_the_field(stack):
    import httpx

    stack.gateway.open_session("bad-1")
    url, before = stack.gateway.url + stack.gateway.session_path("bad-1"), len(stack.requests)
    not_json = httpx.post(f"{url}/v1/chat/completions", content=b"{nope", timeout=30)
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]["message"]
    no_messages = httpx.post(f"{url}/v1/messages", json={"model": "m", "max_tokens": 4}, timeout=30)
    assert no_messages.status_code == 400
    assert no_messages.json()["error"]["message"].startswith("messages:")
    chained = httpx.post(
        f"{url}/v1/responses", json={"model": "m", "input": "hi", "previous_response_id": "resp_1"}, timeout=30
    )
    assert chained.status_code == 400 and chained.json()["error"]["message"].startswith("previous_response_id:")
    assert len(stack.requests) == before and finish(stack, "bad-1") == []


@pytest.fixture
def held_engine(stack):
    """One scripted engine (no router) whose answers wait for `release`; `arrived` is set per request."""
    import threading

    from slime.agent.gateway.server import Gateway
    from slime.rollout.engine_client import EngineClient
    from slime.testing.scripted_engine import ScriptedEngine
    from slime.utils.endpoints import Endpoints

    arrived, release = threading.Event(), threading.Event()

    async def script(body: dict) -> dict:
        arrived.set()
        await asyncio.to_thread(release.wait, 60)
        return stack.answer(body)

    engine = ScriptedEngine(script, stack.model_dir).start()
    client = EngineClient(Endpoints(engine.url, [engine.url]), tokenizer=stack.tok, request_timeout=60.0)
    gw = Gateway(client, tokenizer=stack.tok).start()
    yield gw, engine, arrived, release
    release.set()
    gw.stop()
    engine.stop()


def test_finishing_a_session_waits_for_its_turn_in_flight_or_cancels_and_aborts_it(stack, held_engine):
    from concurrent.futures import ThreadPoolExecutor

    gw, engine, arrived, release = held_engine
    msgs = [{"role": "user", "content": "case=chat-held hi"}]

    def ask(sid: str):
        gw.open_session(sid)
        with openai.OpenAI(base_url=gw.base_url(sid), api_key="x", max_retries=0) as client:
            return client.chat.completions.create(model="m", messages=msgs)

    with ThreadPoolExecutor(2) as pool:
        answer = pool.submit(ask, "held-1")
        assert arrived.wait(30)
        finished = pool.submit(lambda: finish_in(gw, "held-1", wait_timeout=30))
        release.set()  # the engine answers while finish_session waits
        assert answer.result(60).choices[0].message.content == "Hello there."
        [sample] = finished.result(60)
    assert_token_exact(stack, sample, [engine.requests[0]])

    arrived.clear()
    release.clear()
    with ThreadPoolExecutor(1) as pool:
        gone = pool.submit(ask, "held-2")
        assert arrived.wait(30)
        assert finish_in(gw, "held-2", wait_timeout=0.2) == []  # gave up waiting: the turn is cancelled ...
        assert {"rid": engine.requests[1]["rid"]} in engine.aborts, "... and aborted on the engine before that"
        with pytest.raises(openai.APIError):
            gone.result(60)


def finish_in(gw, sid: str, wait_timeout: float) -> list[Sample]:
    return asyncio.run(gw.finish_session(sid, base_sample=Sample(index=0, prompt=""), wait_timeout=wait_timeout))
