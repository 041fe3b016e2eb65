"""The request fields real SDK clients send beyond messages and tools -- `n`, `stop` /
`stop_sequences`, images and documents, `count_tokens`, an engine's own length refusal -- through the
`openai` and `anthropic` clients, against scripted engines behind the real sglang-router.

Each field is honoured or refused with a 400 naming it; none is silently ignored, and the tokens
recorded stay exactly the ones the engine sampled."""

from __future__ import annotations

import asyncio
import base64
import json

import anthropic
import openai
import pytest

from slime.agent.gateway.server import GatewayConfig
from slime.testing.agent_stack import AgentStack, log_probs
from slime.utils.types import Sample

CALL_ADD = '<tool_call>\n{"name":"add","arguments":{"a":3,"b":4}}\n</tool_call>'  # compact, as models write it
ADD_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
ADD_TOOL = {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": ADD_SCHEMA}}
ANTHROPIC_ADD = {"name": "add", "description": "Add.", "input_schema": ADD_SCHEMA}
SGLANG_TOO_LONG = "The input (5000 tokens) is longer than the model's context length (4096 tokens)."
REPLIES = {
    "stop": ["The answer is 7. DONE and some more words", "Next. DONE again"],
    "tool": [CALL_ADD, "It is 7.", "Still 7."],
    "chat": ["Hello there."],
    "toolong": [
        {"raw": json.dumps({"error": {"message": SGLANG_TOO_LONG}}), "status": 400, "media_type": "application/json"}
    ],
}
PIXEL = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 40_000).decode()  # 40 kB of "image"


class StopHonouringStack(AgentStack):
    """Scripted engines that end an answer where SGLang does: at the token completing the first of
    the request's `stop` strings (kept in the ids, `no_stop_trim`), finish `stop` with `matched`."""

    def answer(self, body: dict) -> dict:
        text = self.tok.decode(body["input_ids"], skip_special_tokens=False)
        case = text.split("case=", 1)[1].split()[0] if "case=" in text else "chat"
        turn = text.count("<|im_start|>assistant") - 1
        script = REPLIES[case.split("-")[0]]
        reply = script[min(turn, len(script) - 1)]
        if isinstance(reply, dict):
            return reply
        ids = self.tok.encode(reply, add_special_tokens=False)
        stops = body["sampling_params"].get("stop") or []
        for n in range(1, len(ids) + 1):
            hit = next(
                (s for s in ([stops] if isinstance(stops, str) else stops) if s in self.tok.decode(ids[:n])), None
            )
            if hit is not None:
                return {"output_ids": ids[:n], "finish_type": "stop", "matched": hit, "log_probs": log_probs(turn, n)}
        ids.append(self.end_id)
        out = {"output_ids": ids, "finish_type": "stop", "log_probs": log_probs(turn, len(ids))}
        k = body.get("top_logprobs_num") or 0
        if k:  # the sampled id first, then ids of "A", "B", ... each less likely than the one before
            out["top_log_probs"] = [
                [[lp, t]] + [[lp - j - 1, alt] for j, alt in enumerate(self.alternatives[: k - 1])]
                for t, lp in zip(ids, out["log_probs"])
            ]
        return out

    @property
    def alternatives(self) -> list[int]:
        return [self.tok.convert_tokens_to_ids(c) for c in "ABCDEFGHIJKLMNOPQRST"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = StopHonouringStack.started_on_tiny_qwen(
        lambda case, turn: "", config=GatewayConfig(), log_dir=str(tmp_path_factory.mktemp("router"))
    )
    yield s
    s.stop()


def finish(stack, sid: str) -> list[Sample]:
    return asyncio.run(stack.gateway.finish_session(sid, base_sample=Sample(index=0, prompt="p"), reward=1.0))


def key_of(stack, sid: str) -> str:
    """The session's key, opening the session on first use (the gateway refuses a session never opened)."""
    return stack.gateway.session_key(sid) if sid in stack.gateway.sessions else stack.gateway.open_session(sid)


def openai_client(stack, sid: str) -> openai.OpenAI:
    key_of(stack, sid)
    return openai.OpenAI(base_url=stack.gateway.base_url(sid), api_key="unused", max_retries=0)


def anthropic_client(stack, sid: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.gateway.url, api_key=key_of(stack, sid), max_retries=0)


# ---------------------------------------------------------------- n


def test_n_above_one_is_refused_naming_the_field_and_n_1_is_served(stack):
    msgs = [{"role": "user", "content": "case=chat-n hi"}]
    with openai_client(stack, "n-1") as client:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="m", messages=msgs, n=3)
        assert e.value.body["param"] == "n" and "--n-samples-per-prompt" in e.value.body["message"]
        r = client.chat.completions.create(model="m", messages=msgs, n=1)
    assert [c.message.content for c in r.choices] == ["Hello there."]
    assert len(stack.requests_of("chat-n")) == 1  # the refused request reached no engine


# ---------------------------------------------------------------- stop


def test_openai_stop_is_cut_from_the_text_and_the_ids_stay_what_was_sampled(stack):
    msgs = [{"role": "user", "content": "case=stop-oa what is 3+4?"}]
    with openai_client(stack, "stop-oa") as client:
        r1 = client.chat.completions.create(model="m", messages=msgs, stop=["DONE", "never"])
        assert (r1.choices[0].message.content, r1.choices[0].finish_reason) == ("The answer is 7.", "stop")
        msgs += [r1.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
        chunks = list(client.chat.completions.create(model="m", messages=msgs, stop="DONE", stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Next."
    assert chunks[-1].choices[0].finish_reason == "stop"

    bodies = stack.requests_of("stop-oa")
    assert bodies[0]["sampling_params"]["stop"] == ["DONE", "never"]
    [sample] = finish(stack, "stop-oa")  # one chain: the echoed (cut) answer extends the recorded one
    first = stack.answer(bodies[0])["output_ids"]
    assert stack.tok.decode(first).endswith("DONE")  # the sampled ids keep the stop string
    p0 = len(bodies[0]["input_ids"])
    assert sample.tokens[:p0] == bodies[0]["input_ids"] and sample.tokens[p0 : p0 + len(first)] == first
    assert sample.loss_mask[: len(first)] == [1] * len(first)
    assert bodies[1]["input_ids"][: p0 + len(first)] == sample.tokens[: p0 + len(first)]  # history not re-tokenised


def test_anthropic_stop_sequences_answer_stop_sequence_with_the_string_streamed_and_not(stack):
    msgs = [{"role": "user", "content": "case=stop-an what is 3+4?"}]
    with anthropic_client(stack, "stop-an") as client:
        m1 = client.messages.create(model="m", max_tokens=64, messages=msgs, stop_sequences=["DONE"])
        assert (m1.stop_reason, m1.stop_sequence) == ("stop_sequence", "DONE")
        assert [b.text for b in m1.content] == ["The answer is 7."]
        msgs += [
            {"role": "assistant", "content": [b.model_dump() for b in m1.content]},
            {"role": "user", "content": "more"},
        ]
        with client.messages.stream(model="m", max_tokens=64, messages=msgs, stop_sequences=["DONE"]) as stream:
            final = stream.get_final_message()
        assert (final.stop_reason, final.stop_sequence, final.content[0].text) == ("stop_sequence", "DONE", "Next.")
    with anthropic_client(stack, "stop-an-none") as client:  # no stop string matched: end_turn
        m3 = client.messages.create(
            model="m", max_tokens=64, messages=[{"role": "user", "content": "case=chat x"}], stop_sequences=["never"]
        )
    finish(stack, "stop-an-none")
    assert (m3.stop_reason, m3.stop_sequence) == ("end_turn", None)
    [sample] = finish(stack, "stop-an")
    assert len(stack.requests_of("stop-an")) == 2 and sum(sample.loss_mask) > 0


# ---------------------------------------------------------------- images and documents


def test_images_and_documents_are_refused_naming_the_block_in_each_apis_format(stack):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}}
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "a doc"}}
    with anthropic_client(stack, "img-an") as client:
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(
                model="m",
                max_tokens=8,
                messages=[
                    {"role": "user", "content": [{"type": "text", "text": "case=chat-img what is this?"}, image]}
                ],
            )
        assert e.value.body["error"]["type"] == "invalid_request_error"
        assert e.value.body["error"]["message"].startswith("messages[0].content[1]: a 'image' block")
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(
                model="m",
                max_tokens=8,
                messages=[
                    {"role": "user", "content": "case=chat-img add"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {}}]},
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t1",
                                "content": [{"type": "text", "text": "see"}, document],
                            }
                        ],
                    },
                ],
                tools=[ANTHROPIC_ADD],
            )
        assert e.value.body["error"]["message"].startswith("messages[2].content[0].content[1]: a 'document' block")
    url = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}}
    with openai_client(stack, "img-oa") as client:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": [{"type": "text", "text": "case=chat-img what?"}, url]}],
            )
        assert e.value.body["param"] == "messages[0].content[1]"
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(
                model="m",
                input=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "case=chat-img what?"},
                            {"type": "input_image", "image_url": f"data:image/png;base64,{PIXEL}"},
                        ],
                    }
                ],
            )
        assert e.value.body["param"] == "input[0].content[1]"
    assert stack.requests_of("chat-img") == []  # nothing reached an engine


# ---------------------------------------------------------------- the engine's length refusal


def test_sglangs_own_length_refusal_is_context_length_exceeded_in_each_format(stack):
    msgs = [{"role": "user", "content": "case=toolong-x hi"}]
    with openai_client(stack, "long-oa") as client:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="m", messages=msgs)
    assert e.value.body["code"] == "context_length_exceeded" and SGLANG_TOO_LONG in e.value.body["message"]
    with anthropic_client(stack, "long-an") as client:
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model="m", max_tokens=8, messages=msgs)
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert e.value.body["error"]["message"].startswith("prompt is too long")


# ---------------------------------------------------------------- logprobs


def test_openai_logprobs_are_the_engines_own_for_each_sampled_token_streamed_and_not(stack):
    msgs = [{"role": "user", "content": "case=chat-lp hi"}]
    with openai_client(stack, "lp-oa") as client:
        plain = client.chat.completions.create(model="m", messages=msgs)
        assert plain.choices[0].logprobs is None  # not asked, not sent
        r = client.chat.completions.create(model="m", messages=msgs, logprobs=True, top_logprobs=0)
        chunks = list(client.chat.completions.create(model="m", messages=msgs, logprobs=True, stream=True))
        top = client.chat.completions.create(model="m", messages=msgs, logprobs=True, top_logprobs=3)
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="m", messages=msgs, top_logprobs=3)
        assert e.value.body["param"] == "top_logprobs"
        resp = client.responses.create(
            model="m", input="case=chat-lp hi", include=["message.output_text.logprobs"], top_logprobs=2
        )
    body = stack.requests_of("chat-lp")[1]
    sampled = stack.answer(body)  # the text's ids, then <|im_end|>, which no API shows
    expected = [(stack.tok.decode([t]), lp) for t, lp in zip(sampled["output_ids"][:-1], sampled["log_probs"])]
    assert [(t.token, t.logprob) for t in r.choices[0].logprobs.content] == expected
    assert "".join(t.token for t in r.choices[0].logprobs.content) == r.choices[0].message.content
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == expected
    resp_lps = resp.output[0].content[0].logprobs
    assert [(t.token, t.logprob) for t in resp_lps] == expected
    assert [t.bytes for t in resp_lps] == [list(t.encode()) for t, _ in expected]
    # top_logprobs: the engine's own k best per position (top_logprobs_num), never made up
    asked = [b.get("top_logprobs_num") for b in stack.requests_of("chat-lp")]
    assert asked == [None, None, None, 3, 2]
    engine_tops = stack.answer(stack.requests_of("chat-lp")[3])["top_log_probs"]
    assert [[(a.token, a.logprob) for a in t.top_logprobs] for t in top.choices[0].logprobs.content] == [
        [(stack.tok.decode([i]), lp) for lp, i in row] for row in engine_tops[:-1]
    ]
    assert [len(t.top_logprobs) for t in resp_lps] == [2] * len(expected)
    assert all(t.top_logprobs == [] for t in r.choices[0].logprobs.content)
    finish(stack, "lp-oa")


# ---------------------------------------------------------------- tool_choice and parallel calls

TWO_CALLS = CALL_ADD + "\n" + CALL_ADD.replace('"a":3', '"a":5')
REPLIES.update(
    {
        "two": [TWO_CALLS, "Both done."],
        "plain": ["I will not call anything.", "ok"],
        "args": ['{"a":1,"b":2}}\n</tool_call>', "3."],
    }
)


def test_tool_choice_none_offers_no_tools_and_returns_no_call(stack):
    msgs = [{"role": "user", "content": "case=tool-none 3+4?"}]
    with openai_client(stack, "tc-none") as client:
        r = client.chat.completions.create(model="m", messages=msgs, tools=[ADD_TOOL], tool_choice="none")
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == CALL_ADD  # the model's text, not a call
    [body] = stack.requests_of("tool-none")
    assert '"name": "add"' not in stack.tok.decode(body["input_ids"])  # the tool was not offered
    with anthropic_client(stack, "tc-none-an") as client:
        m = client.messages.create(
            model="m",
            max_tokens=64,
            tools=[ANTHROPIC_ADD],
            tool_choice={"type": "none"},
            messages=[{"role": "user", "content": "case=tool-nan 3+4?"}],
        )
    assert m.stop_reason == "end_turn" and [b.type for b in m.content] == ["text"]
    finish(stack, "tc-none")
    finish(stack, "tc-none-an")


def test_a_named_or_required_tool_starts_the_answer_with_the_call_and_trains_only_what_was_sampled(stack):
    msgs = [{"role": "user", "content": "case=args-named add 1 and 2"}]
    named = {"type": "function", "function": {"name": "add"}}
    with openai_client(stack, "tc-named") as client:
        r = client.chat.completions.create(model="m", messages=msgs, tools=[ADD_TOOL], tool_choice=named)
        [call] = r.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 1, "b": 2})
        assert r.choices[0].finish_reason == "tool_calls"
        msgs += [
            r.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "3"},
        ]
        r2 = client.chat.completions.create(model="m", messages=msgs, tools=[ADD_TOOL])
        assert r2.choices[0].message.content == "3."
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(
                model="m",
                messages=msgs,
                tools=[ADD_TOOL],
                tool_choice={"type": "function", "function": {"name": "mul"}},
            )
        assert e.value.body["param"] == "tool_choice.function.name"
    bodies = stack.requests_of("args-named")
    prompt = stack.tok.decode(bodies[0]["input_ids"])
    assert prompt.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": ')
    [sample] = finish(stack, "tc-named")
    first = stack.answer(bodies[0])["output_ids"]
    p0 = len(bodies[0]["input_ids"])  # the forced opening is prompt (mask 0); the model's arguments are mask 1
    assert sample.tokens[:p0] == bodies[0]["input_ids"] and sample.tokens[p0 : p0 + len(first)] == first
    assert sample.loss_mask[: len(first)] == [1] * len(first)
    assert bodies[1]["input_ids"][: p0 + len(first)] == sample.tokens[: p0 + len(first)]


def test_anthropic_any_and_tool_choices_force_a_call_and_an_unmet_one_is_answered_as_sampled(stack):
    with anthropic_client(stack, "tc-an") as client:
        m = client.messages.create(
            model="m",
            max_tokens=64,
            tools=[ANTHROPIC_ADD],
            tool_choice={"type": "tool", "name": "add"},
            messages=[{"role": "user", "content": "case=args-an add 1 and 2"}],
        )
        assert m.stop_reason == "tool_use" and [(b.name, b.input) for b in m.content] == [("add", {"a": 1, "b": 2})]
        # the model ignores the forced opening: its answer is returned as sampled, not retried or made up
        m2 = client.messages.create(
            model="m",
            max_tokens=64,
            tools=[ANTHROPIC_ADD],
            tool_choice={"type": "any"},
            messages=[{"role": "user", "content": "case=plain-an add 1 and 2"}],
        )
        assert m2.stop_reason == "end_turn" and [(b.type, b.text) for b in m2.content] == [("text", "")]
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(
                model="m",
                max_tokens=8,
                tool_choice={"type": "any"},
                messages=[{"role": "user", "content": "case=plain-an x"}],
            )
        assert e.value.body["error"]["message"].startswith("tool_choice: asks for a tool call")
    samples = finish(stack, "tc-an")
    [unmet] = [s for s in samples if "case=plain-an" in stack.tok.decode(s.tokens)]
    assert unmet.metadata["ill_formed"] is True  # recorded and trained as sampled, marked ill-formed


def test_parallel_tool_calls_false_returns_at_most_one_call_in_each_api(stack):
    msgs = [{"role": "user", "content": "case=two-oa add twice"}]
    with openai_client(stack, "par-oa") as client:
        both = client.chat.completions.create(model="m", messages=msgs, tools=[ADD_TOOL])
        assert len(both.choices[0].message.tool_calls) == 2
        one = client.chat.completions.create(model="m", messages=msgs, tools=[ADD_TOOL], parallel_tool_calls=False)
        assert [json.loads(c.function.arguments)["a"] for c in one.choices[0].message.tool_calls] == [3]
        assert one.choices[0].finish_reason == "tool_calls"
    with anthropic_client(stack, "par-an") as client:
        m = client.messages.create(
            model="m",
            max_tokens=64,
            tools=[ANTHROPIC_ADD],
            tool_choice={"type": "auto", "disable_parallel_tool_use": True},
            messages=[{"role": "user", "content": "case=two-an add twice"}],
        )
    assert [b.input["a"] for b in m.content if b.type == "tool_use"] == [3] and m.stop_reason == "tool_use"
    [body] = stack.requests_of("two-an")
    assert body["sampling_params"]["stop"] == ["</tool_call>"]  # the engine stopped after the first call
    assert stack.tok.decode(stack.answer(body)["output_ids"]).count("<tool_call>") == 1
    finish(stack, "par-oa")
    finish(stack, "par-an")


# ---------------------------------------------------------------- count_tokens


def test_count_tokens_is_the_prompt_the_next_turn_really_sends_over_a_multi_turn_history(stack):
    msgs: list = [{"role": "user", "content": "case=tool-count 3+4, then 5+6?"}]
    counted, sent = [], []
    with anthropic_client(stack, "count-an") as client:
        for _ in range(3):
            counted.append(
                client.messages.count_tokens(
                    model="m", system="Add.", messages=msgs, tools=[ANTHROPIC_ADD]
                ).input_tokens
            )
            m = client.messages.create(model="m", max_tokens=64, system="Add.", messages=msgs, tools=[ANTHROPIC_ADD])
            sent.append(m.usage.input_tokens)
            msgs.append({"role": "assistant", "content": [b.model_dump() for b in m.content]})
            uses = [b for b in m.content if b.type == "tool_use"]
            msgs.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "7"} for u in uses] or "go on",
                }
            )
    bodies = stack.requests_of("tool-count")
    assert sent == [len(b["input_ids"]) for b in bodies]
    assert counted == sent
    finish(stack, "count-an")
