"""Through the real gateway, scripted engines behind the real sglang-router and the real `openai`
SDK: conversations interleaved in one session (a sub-agent speaking between the main agent's
turns), tool calls written as compact JSON (not how the chat template renders them), and an agent
that does not echo `reasoning_content` back. Each conversation keeps its own history (the ids
sampled, never re-rendered), so every sampled answer is trained exactly once, each in its
conversation's token-exact Sample."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from slime.agent.gateway.server import GatewayConfig
from slime.testing.agent_stack import AgentStack, assert_chain
from slime.utils.types import Sample

COMPACT_CALL = '<tool_call>\n{"name":"add","arguments":{"a":3,"b":4}}\n</tool_call>'
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
REPLIES = {
    "main": [COMPACT_CALL, COMPACT_CALL, "3 + 4 = 7."],
    "sub": ["Looking.", COMPACT_CALL, "Found it."],
    "think": [
        "<think>\nThe user greets me.\n</think>\n\nHello there.",
        "<think>\nAgain.\n</think>\n\nStill here.",
        "Bye.",
    ],
}


def replies(case: str, turn: int) -> str:
    script = REPLIES[case.split("-")[0]]
    return script[min(turn, len(script) - 1)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = AgentStack.started_on_tiny_qwen(
        replies, config=GatewayConfig(reasoning_parser="qwen3"), log_dir=str(tmp_path_factory.mktemp("router"))
    )
    yield s
    s.stop()


def url_of(stack, sid: str) -> str:
    """The session's base URL (its key in the path), opening the session on first use."""
    if sid not in stack.gateway.sessions:
        stack.gateway.open_session(sid)
    return stack.gateway.base_url(sid)


def finish(stack, sid: str) -> list[Sample]:
    return asyncio.run(stack.gateway.finish_session(sid, base_sample=Sample(index=0, prompt="p"), reward=1.0))


def chain_of(stack, case: str) -> list[tuple[list[int], list[int], list[float]]]:
    bodies = stack.requests_of(case)
    return [(b["input_ids"], a["output_ids"], a["log_probs"]) for b, a in ((b, stack.answer(b)) for b in bodies)]


def trained_spans(samples: list[Sample]) -> list[list[float]]:
    """Each Sample's mask-1 log-probs (unique per turn and position in the scripted engines)."""
    return [[lp for m, lp in zip(s.loss_mask, s.rollout_log_probs) if m] for s in samples]


def test_a_sub_agent_interleaved_with_the_main_agent_trains_each_answer_once(stack):
    main = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "case=main-1 3+4?"}]
    sub = [{"role": "system", "content": "You search."}, {"role": "user", "content": "case=sub-1 find add"}]
    with openai.OpenAI(base_url=url_of(stack, "branch-1"), api_key="x", max_retries=0) as client:

        def turn(msgs: list[dict]) -> None:
            r = client.chat.completions.create(model="m", messages=msgs, tools=[ADD_TOOL], max_tokens=64)
            message = r.choices[0].message
            msgs.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls or []:
                assert json.loads(call.function.arguments) == {"a": 3, "b": 4}
                msgs.append({"role": "tool", "tool_call_id": call.id, "content": "7"})
            if not message.tool_calls:
                msgs.append({"role": "user", "content": "go on"})

        for msgs in (main, sub, main, sub, main, sub):  # the two conversations take turns in one session
            turn(msgs)
    samples = finish(stack, "branch-1")
    by_case = {("main" if "case=main-1" in stack.tok.decode(s.tokens) else "sub"): s for s in samples}
    assert len(samples) == 2 and set(by_case) == {"main", "sub"}
    assert_chain(by_case["main"], chain_of(stack, "main-1"))  # three turns, no re-rendered answer
    assert_chain(by_case["sub"], chain_of(stack, "sub-1"))
    assert sorted(map(len, trained_spans(samples))) == sorted(
        sum(len(ids) for _, ids, _ in chain_of(stack, c)) for c in ("main-1", "sub-1")
    )


def test_an_agent_that_drops_reasoning_content_keeps_its_answers_trained(stack):
    msgs = [{"role": "user", "content": "case=think-1 hi"}]
    with openai.OpenAI(base_url=url_of(stack, "branch-2"), api_key="x", max_retries=0) as client:
        for _ in range(3):
            r = client.chat.completions.create(model="m", messages=msgs, max_tokens=64)
            assert "think" not in r.choices[0].message.content
            msgs += [
                {"role": "assistant", "content": r.choices[0].message.content},  # no reasoning_content
                {"role": "user", "content": "and?"},
            ]
    [sample] = finish(stack, "branch-2")
    assert_chain(sample, chain_of(stack, "think-1"))  # the reasoning the model sampled stays, trained once


def test_a_retried_request_and_an_edited_answer_branch_and_train_every_answer_once(stack):
    msgs = [{"role": "user", "content": "case=sub-2 find add"}]
    with openai.OpenAI(base_url=url_of(stack, "branch-3"), api_key="x", max_retries=0) as client:
        first = client.chat.completions.create(model="m", messages=msgs, max_tokens=64)
        edited = [
            *msgs,
            {"role": "assistant", "content": first.choices[0].message.content + " (edited)"},
            {"role": "user", "content": "go on"},
        ]
        client.chat.completions.create(model="m", messages=edited, max_tokens=64)
        client.chat.completions.create(model="m", messages=edited, max_tokens=64)  # a retry of the same request
    samples = finish(stack, "branch-3")
    sampled = [lps for _, _, lps in chain_of(stack, "sub-2")]
    assert sorted(trained_spans(samples)) == sorted(sampled)  # three answers, each trained in one Sample


def test_a_turn_checks_only_its_new_messages_and_an_edited_history_is_still_seen(stack, monkeypatch):
    """Issue 29's cost: the gateway checks and translates a body only past the history an earlier body
    of the session held (counted through the protocol's own functions), and an earlier message
    edited in place is still read, so the edit branches and every answer is trained once."""
    from slime.agent.gateway.protocols import openai_chat

    checked: list[str] = []
    check_message = openai_chat.check_message
    monkeypatch.setattr(openai_chat, "check_message", lambda m, path: (checked.append(path), check_message(m, path)))
    msgs = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "case=main-3 3+4?"}]
    per_request, renders = [], stack.gateway.pipeline.renderer.full_renders
    with openai.OpenAI(base_url=url_of(stack, "branch-4"), api_key="x", max_retries=0) as client:
        for k in range(8):
            del checked[:]
            message = (
                client.chat.completions.create(model="m", messages=msgs, tools=[ADD_TOOL], max_tokens=64)
                .choices[0]
                .message
            )
            per_request.append(len(checked))
            msgs.append(message.model_dump(exclude_none=True))
            msgs.append(
                {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": f"{k} " * 1000}
                if message.tool_calls
                else {"role": "user", "content": f"step {k} " * 500}
            )
        assert per_request == [2] + [2] * 7  # the two new messages, not 4, 6, ... 16
        del checked[:]
        msgs[3] = {**msgs[3], "content": "7 (edited)"}  # the first tool result, edited in place
        client.chat.completions.create(model="m", messages=msgs, tools=[ADD_TOOL], max_tokens=64)
        assert len(checked) == len(msgs)  # read whole
    samples = finish(stack, "branch-4")
    assert len(samples) == 2  # the edit branched at that message
    assert sorted(sum(trained_spans(samples), [])) == sorted(sum((lps for *_, lps in chain_of(stack, "main-3")), []))
    # rendered whole once: the edited body continues the first answer (the last its messages still spell)
    assert stack.gateway.pipeline.renderer.full_renders - renders == 1
