"""The wire protocols on dicts alone: whatever answer the gateway sends, the client's echo of it in
the next request translates back to exactly the message the session tree recorded (else every
turn would fork); and refusals come in each API's own error shape."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from slime.agent.gateway.errors import ContextFullError, SessionClosedError, TurnCapError
from slime.agent.gateway.pipeline import recorded_message
from slime.agent.gateway.protocols import anthropic, openai_chat, openai_responses
from slime.agent.gateway.records import ChatRequest, Reply, ToolUse, Usage

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
tool_uses = st.builds(
    ToolUse,
    st.from_regex(r"[a-z_][a-z0-9_]{0,11}", fullmatch=True),
    st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=4),
)


@st.composite
def replies(draw) -> Reply:
    text = draw(st.text(max_size=40)).strip()
    reasoning = draw(st.text(max_size=20)).strip()
    uses = draw(st.lists(tool_uses, max_size=3))
    finish = "tool_calls" if uses else draw(st.sampled_from(["stop", "length"]))
    return Reply(
        text=text,
        tool_uses=uses,
        finish_reason=finish,
        usage=Usage(3, 4),
        reasoning=reasoning,
        message=recorded_message(text, reasoning, uses),
    )


REQUEST = ChatRequest(session_id="s", messages=[{"role": "user", "content": "hi"}])


def over_the_wire(obj):
    return json.loads(json.dumps(obj))


@settings(max_examples=100, deadline=None)
@given(replies())
def test_an_openai_chat_answer_echoed_back_is_the_recorded_message(reply):
    echo = over_the_wire(openai_chat.render_reply(reply, REQUEST))["choices"][0]["message"]
    assert openai_chat.translate_messages([echo]) == [reply.message]


@settings(max_examples=100, deadline=None)
@given(replies())
def test_an_anthropic_answer_echoed_back_is_the_recorded_message(reply):
    content = over_the_wire(anthropic.render_reply(reply, REQUEST))["content"]
    assert anthropic.translate_messages([{"role": "assistant", "content": content}], None) == [reply.message]


@settings(max_examples=100, deadline=None)
@given(replies())
def test_a_responses_answer_echoed_back_is_the_recorded_message(reply):
    output = over_the_wire(openai_responses.render_reply(reply, REQUEST))["output"]
    assert openai_responses.translate_items(output) == [reply.message]


def test_stop_reasons_map_to_each_apis_words():
    def reply(finish, uses=()):
        return Reply("t", list(uses), finish, Usage(1, 1), message={})

    call = [ToolUse("f", {})]
    assert [
        anthropic.render_reply(reply(f, u), REQUEST)["stop_reason"]
        for f, u in (("stop", ()), ("length", ()), ("tool_calls", call))
    ] == ["end_turn", "max_tokens", "tool_use"]
    assert [
        openai_chat.render_reply(reply(f, u), REQUEST)["choices"][0]["finish_reason"]
        for f, u in (("stop", ()), ("length", ()), ("tool_calls", call))
    ] == ["stop", "length", "tool_calls"]
    resp = openai_responses.render_reply(reply("length"), REQUEST)
    assert (resp["status"], resp["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})


def test_refusals_come_in_each_apis_error_shape():
    full = ContextFullError("prompt is too long: 9 tokens >= 8")
    assert anthropic.render_error(full) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "prompt is too long: 9 tokens >= 8"},
    }
    assert openai_chat.render_error(full) == {
        "error": {
            "message": "prompt is too long: 9 tokens >= 8",
            "type": "invalid_request_error",
            "param": None,
            "code": "context_length_exceeded",
        }
    }
    assert (TurnCapError.status, openai_responses.render_error(TurnCapError("x"))["error"]["type"]) == (
        429,
        "rate_limit_error",
    )
    assert (SessionClosedError.status, anthropic.render_error(SessionClosedError("x"))["error"]["type"]) == (
        503,
        "overloaded_error",
    )


def test_responses_input_groups_assistant_items_into_one_message():
    items = [
        {"role": "developer", "content": "rules"},
        "ignored",
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "not json"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
    ]
    assert openai_responses.translate_items(items) == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "a",
            "reasoning_content": "think",
            "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}},
                {"type": "function", "function": {"name": "g", "arguments": {"_raw_arguments": "not json"}}},
            ],
        },
        {"role": "tool", "content": "1"},
    ]


def test_an_engines_400_is_the_clients_bad_request_and_an_over_long_prompt_says_so():
    from slime.agent.gateway.errors import BadRequestError, EngineFailedError
    from slime.agent.gateway.pipeline import _engine_refusal
    from slime.utils.http_retry import HttpError

    long = _engine_refusal(
        HttpError("x", 400, "input_ids is too long: 9000 tokens, the model's context length is 8192"), 9000, "s"
    )
    assert isinstance(long, ContextFullError) and long.status == 400
    assert str(long).startswith("prompt is too long: 9000 tokens; the engine says: input_ids is too long")
    assert isinstance(_engine_refusal(HttpError("x", 400, "bad top_p"), 3, "s"), BadRequestError)
    down = _engine_refusal(HttpError("POST /generate failed after 3 attempt(s)", None, ""), 3, "s")
    assert isinstance(down, EngineFailedError) and down.status == 502


# ---------------------------------------------------------------- media blocks and tool_choice

MEDIA = {
    "anthropic": ["image", "document"],
    "chat": ["image_url", "input_audio", "file"],
    "responses": ["input_image", "input_file"],
}


@st.composite
def content_with_media(draw):
    """(api, body, path of the first media block): text blocks around one media block, which may sit
    inside a tool result (Anthropic) or a function output (Responses)."""
    api = draw(st.sampled_from(sorted(MEDIA)))
    kind = draw(st.sampled_from(MEDIA[api]))
    text_type = {"anthropic": "text", "chat": "text", "responses": "input_text"}[api]
    before = draw(st.integers(0, 3))
    blocks = [{"type": text_type, "text": f"t{i}"} for i in range(before)]
    blocks += [{"type": kind, "source": {"data": "QUJD" * 50}}, {"type": text_type, "text": "after"}]
    nested = api != "chat" and draw(st.booleans())
    if api == "anthropic":
        if nested:
            msg = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": blocks}]}
            return api, {"max_tokens": 4, "messages": [msg]}, f"messages[0].content[0].content[{before}]"
        return (
            api,
            {"max_tokens": 4, "messages": [{"role": "user", "content": blocks}]},
            f"messages[0].content[{before}]",
        )
    if api == "chat":
        return api, {"messages": [{"role": "user", "content": blocks}]}, f"messages[0].content[{before}]"
    if nested:
        return (
            api,
            {"input": [{"type": "function_call_output", "call_id": "c", "output": blocks}]},
            f"input[0].output[{before}]",
        )
    return api, {"input": [{"role": "user", "content": blocks}]}, f"input[0].content[{before}]"


@settings(max_examples=60, deadline=None)
@given(content_with_media())
def test_a_media_block_anywhere_is_refused_naming_its_path_and_type(case):
    from slime.agent.gateway.errors import FieldError

    api, body, path = case
    protocol = {"anthropic": anthropic, "chat": openai_chat, "responses": openai_responses}[api]
    try:
        protocol.parse_request(body, {})
    except FieldError as e:
        assert e.param == path and str(e).split("'")[1] in MEDIA[api]  # "<path>: a '<type>' block: ..."
    else:
        raise AssertionError(f"{api}: a media block at {path} was accepted")


TOOLS = {
    "anthropic": [{"name": "f", "input_schema": {}}, {"name": "g", "input_schema": {}}],
    "chat": [{"type": "function", "function": {"name": n}} for n in ("f", "g")],
    "responses": [{"type": "function", "name": n} for n in ("f", "g")],
}


def spelled(api: str, mode: str, name: str | None, parallel: bool) -> dict:
    """One tool choice in `api`'s own spelling."""
    if api == "anthropic":
        kind = {"auto": "auto", "none": "none", "required": "tool" if name else "any"}[mode]
        return {
            "tool_choice": {"type": kind, **({"name": name} if name else {}), "disable_parallel_tool_use": not parallel}
        }
    choice = (
        mode
        if not name
        else ({"type": "function", "function": {"name": name}} if api == "chat" else {"type": "function", "name": name})
    )
    return {"tool_choice": choice, "parallel_tool_calls": parallel}


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(sorted(TOOLS)),
    st.sampled_from(["auto", "none", "required"]),
    st.sampled_from([None, "f", "g"]),
    st.booleans(),
)
def test_each_apis_tool_choice_spelling_means_the_same_and_none_offers_no_tools(api, mode, name, parallel):
    from slime.agent.gateway.records import ToolChoice

    name = name if mode == "required" else None
    body = {
        "anthropic": {"max_tokens": 4, "messages": [{"role": "user", "content": "x"}]},
        "chat": {"messages": [{"role": "user", "content": "x"}]},
        "responses": {"input": "x"},
    }[api]
    protocol = {"anthropic": anthropic, "chat": openai_chat, "responses": openai_responses}[api]
    req = protocol.parse_request({**body, "tools": TOOLS[api], **spelled(api, mode, name, parallel)}, {})
    assert req.tool_choice == ToolChoice(mode, name, parallel)
    assert (req.tools is None) == (mode == "none")
