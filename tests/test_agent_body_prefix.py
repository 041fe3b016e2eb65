"""A session's request bodies are parsed, checked and translated only past the history an earlier
body of the session already held (`protocols.body_prefix`, issue 29's cost), and that shortcut
never changes an answer: hypothesis sends sequences of bodies -- histories that grow, get edited,
cut, re-serialised with other whitespace or key order, sub-conversations interleaved -- in each
protocol, and every parse must equal `json.loads` and every translation the one of the body read
whole. Counted, not timed: only the new messages are checked and translated."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime.agent.gateway.errors import BadRequestError, FieldError
from slime.agent.gateway.protocols import anthropic, openai_chat, openai_responses
from slime.agent.gateway.protocols.body_prefix import KEPT_BODIES, BodyPrefixes

PROPERTY = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
PROTOCOLS = {"chat": openai_chat, "anthropic": anthropic, "responses": openai_responses}
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12) | st.sampled_from(
    ["", "x" * 300, 'quote " and \\ back', "é中🙂", "\n\t"]
)
CALL = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["read", "add"]),
        "args": st.dictionaries(st.sampled_from(["a", "path"]), st.integers(-3, 3) | TEXT, max_size=2),
    }
)


def chat_message(draw_role: str, text: str, call: dict) -> dict:
    if draw_role == "assistant+call":
        return {
            "role": "assistant",
            "content": text or None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call["args"])},
                }
            ],
        }
    if draw_role == "tool":
        return {"role": "tool", "tool_call_id": "call_1", "content": text}
    if draw_role == "parts":
        return {"role": "user", "content": [{"type": "text", "text": text}, {"type": "text", "text": "more"}]}
    return {"role": draw_role, "content": text}


def anthropic_message(kind: str, text: str, call: dict) -> dict:
    if kind == "assistant+call":
        return {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": ""},
                {"type": "text", "text": text},
                {"type": "tool_use", "id": "toolu_1", "name": call["name"], "input": call["args"]},
            ],
        }
    if kind == "tool":
        return {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": text},
                {"type": "text", "text": "and"},
            ],
        }
    if kind == "system":  # mid-list: folded into a user message, so the body is translated whole
        return {"role": "system", "content": text}
    return {"role": kind if kind in ("user", "assistant") else "user", "content": text}


def responses_item(kind: str, text: str, call: dict) -> dict:
    if kind == "assistant+call":  # merges into the assistant message before it
        return {"type": "function_call", "call_id": "c1", "name": call["name"], "arguments": json.dumps(call["args"])}
    if kind == "tool":
        return {"type": "function_call_output", "call_id": "c1", "output": text}
    if kind == "system":
        return {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}
    if kind == "assistant":
        return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    return {"role": "developer" if kind == "parts" else "user", "content": text}


MESSAGE = {"chat": chat_message, "anthropic": anthropic_message, "responses": responses_item}
KINDS = st.sampled_from(["user", "assistant", "assistant+call", "tool", "system", "parts"])


def body_of(api: str, history: list[dict], extra: dict, first: bool) -> dict:
    key = "input" if api == "responses" else "messages"
    head = {"model": "m", **extra} if first else {}
    tail = {} if first else {"model": "m", **extra}
    if api == "anthropic":
        return {**head, "system": "sys", key: history, "max_tokens": 16, **tail}
    return {**head, key: history, **tail}


@st.composite
def sessions(draw, api: str):
    """Bodies one session sends: mostly history grown by a few messages, sometimes an edited or cut
    history, another conversation, or the same history serialised differently."""
    make = MESSAGE[api]

    def message() -> dict:
        return make(draw(KINDS), draw(TEXT), draw(CALL))

    histories = [[make("user", "begin", {}), make("user", draw(TEXT), {})]]
    bodies = []
    for _ in range(draw(st.integers(2, 9))):
        step = draw(st.sampled_from(["grow", "grow", "grow", "edit", "cut", "other", "same"]))
        h = list(histories[-1])
        if step == "grow":
            h += [message() for _ in range(draw(st.integers(1, 3)))]
        elif step == "edit":
            at = draw(st.integers(0, len(h) - 1))
            h[at] = message()
        elif step == "cut":
            h = h[: draw(st.integers(1, len(h)))]
        elif step == "other":
            h = [message()] + [message() for _ in range(draw(st.integers(0, 3)))]
        else:
            h = draw(st.sampled_from(histories))
        histories.append(h)
        extra = draw(st.fixed_dictionaries({}, optional={"temperature": st.sampled_from([0.5, 1])}))
        style = draw(st.sampled_from([{}, {"separators": (",", ":")}, {"indent": 1}, {"ensure_ascii": False}]))
        bodies.append(json.dumps(body_of(api, h, extra, draw(st.booleans())), **style).encode())
    return bodies


@pytest.mark.parametrize("api", sorted(PROTOCOLS))
@given(data=st.data())
@PROPERTY
def test_a_body_read_past_a_known_history_is_what_reading_it_whole_gives(api, data):
    protocol, bodies = PROTOCOLS[api], data.draw(sessions(api))
    kept, earlier = BodyPrefixes(), []
    for raw in bodies:
        parsed = kept.parse(raw, protocol.HISTORY, api)
        whole = json.loads(raw)
        assert parsed.body == whole and list(parsed.body) == list(whole)  # same keys, same order
        req = protocol.parse_request(parsed.body, {}, "s", parsed.known)
        ref = protocol.parse_request(whole, {}, "s")
        assert req.messages == ref.messages and req.tools == ref.tools and req.sampling == ref.sampling
        if parsed.known is not None:  # reused: an earlier body's very objects
            assert any(parsed.body[protocol.HISTORY][0] is e[protocol.HISTORY][0] for e in earlier)
        if req.known is not None:
            kept.keep(parsed, req.known)
        earlier.append(parsed.body)


def chat_body(history: list[dict]) -> bytes:
    return json.dumps({"model": "m", "messages": history, "max_tokens": 8}).encode()


def test_only_the_new_messages_are_checked_and_translated_and_an_edit_is_seen(monkeypatch):
    """Counted through the protocol's own check and translation functions."""
    checked, translated = [], []
    check_message, translate = openai_chat.check_message, openai_chat.translate_messages
    monkeypatch.setattr(openai_chat, "check_message", lambda m, path: (checked.append(path), check_message(m, path)))
    monkeypatch.setattr(openai_chat, "translate_messages", lambda ms: (translated.extend(ms), translate(ms))[1])
    kept, history, per_body = BodyPrefixes(), [{"role": "user", "content": "go"}], []
    for k in range(20):
        history += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"c{k}", "type": "function", "function": {"name": "read", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": f"c{k}", "content": f"{k}: " + "data " * 800},
        ]
        del checked[:], translated[:]
        parsed = kept.parse(chat_body(history), "messages", "chat")
        req = openai_chat.parse_request(parsed.body, {}, "s", parsed.known)
        kept.keep(parsed, req.known)
        per_body.append((len(checked), len(translated)))
        assert checked[-1] == f"messages[{len(history) - 1}]"
        assert req.messages[-1]["content"] == history[-1]["content"] and len(req.messages) == len(history)
    assert per_body[0] == (3, 3) and set(per_body[1:]) == {(2, 2)}  # not 5, 7, ... 41

    edited = [*history[:3], {**history[3], "content": "edited"}, *history[4:]]
    del checked[:], translated[:]
    parsed = kept.parse(chat_body(edited), "messages", "chat")
    req = openai_chat.parse_request(parsed.body, {}, "s", parsed.known)
    assert parsed.known is None and len(checked) == len(edited)  # read whole: the bytes changed
    assert req.messages[3]["content"] == "edited"


def test_a_malformed_new_message_is_refused_by_its_path_as_when_read_whole():
    kept = BodyPrefixes()
    history = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "ok"}]
    parsed = kept.parse(chat_body(history), "messages", "chat")
    kept.keep(parsed, openai_chat.parse_request(parsed.body, {}, "s").known)
    for bad, path in (
        ({"role": "robot", "content": "x"}, "messages[2].role"),
        ({"role": "user", "content": "\ud800"}, "messages[2].content"),
        ({"role": "user", "content": [{"type": "image_url"}]}, "messages[2].content[0]"),
    ):
        raw = json.dumps({"model": "m", "messages": [*history, bad], "max_tokens": 8}).encode()
        parsed = kept.parse(raw, "messages", "chat")
        assert parsed.known is not None and parsed.known.count == 2
        with pytest.raises(FieldError) as e:
            openai_chat.parse_request(parsed.body, {}, "s", parsed.known)
        assert e.value.param == path


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"[1]",
        b'{"messages": [1',
        b'\xef\xbb\xbf{"messages": []}',
        b'{"messages": [], "messages": [{"role": "user"}]}',
        b"\xff",
        b'"x"',
        b'{"messages": [{"a": NaN}], "model": "m"} ',
        b'{"a": 1}',
    ],
)
def test_odd_bodies_parse_as_json_loads_does(raw):
    try:
        want = json.loads(raw)
    except ValueError:
        with pytest.raises(BadRequestError):
            BodyPrefixes().parse(raw, "messages", "chat")
        return
    parsed = BodyPrefixes().parse(raw, "messages", "chat")
    assert json.dumps(parsed.body) == json.dumps(want) and parsed.known is None


def test_a_session_keeps_a_few_bodies_per_protocol():
    kept = BodyPrefixes()
    for i in range(KEPT_BODIES + 3):  # unrelated conversations: each kept until the oldest falls out
        parsed = kept.parse(chat_body([{"role": "user", "content": f"conversation {i}"}]), "messages", "chat")
        kept.keep(parsed, openai_chat.parse_request(parsed.body, {}, "s").known)
    assert len(kept._kept) == KEPT_BODIES
    grown = chat_body(
        [{"role": "user", "content": f"conversation {KEPT_BODIES + 2}"}, {"role": "assistant", "content": "a"}]
    )
    assert kept.parse(grown, "messages", "chat").known.count == 1
    assert kept.parse(grown, "messages", "anthropic").known is None  # another protocol's parse is not reused


def test_sessions_opening_with_one_prompt_render_it_once_and_any_other_prompt_anew():
    """A GRPO group's sessions open with one task prompt: the gateway renders it once (keyed by the
    messages' and tools' content), and a prompt differing in one character or in its tools is rendered."""
    from transformers import AutoTokenizer

    from slime.agent.gateway.rendering import DeltaRender
    from slime.agent.gateway.session import Session
    from slime.testing.tiny_model import qwen_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    render = DeltaRender(tok)
    task = [{"role": "system", "content": "You fix code."}, {"role": "user", "content": "fix add()"}]
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]

    def fresh(messages, tools=None):
        return tok.apply_chat_template(
            messages, tools=tools, tokenize=True, add_generation_prompt=True, return_dict=False
        )

    first = render.prompt_ids(Session("a"), task, None)
    assert render.prompt_ids(Session("b"), json.loads(json.dumps(task)), None) is first and render.full_renders == 1
    assert first == fresh(task)
    other = [task[0], {"role": "user", "content": "fix add!"}]
    assert render.prompt_ids(Session("c"), other, None) == fresh(other) and render.full_renders == 2
    assert render.prompt_ids(Session("d"), task, tools) == fresh(task, tools) and render.full_renders == 3


def test_an_answer_echoed_back_is_compared_once_not_on_every_later_turn(monkeypatch):
    """Our answer comes back as the client's copy, the same object in every later body (above): the walks of
    a session's conversations and of its turn tree compare it with the recorded answer once, then know it by
    identity; an edited copy is compared again and found different. Counted through `same_message`."""
    from slime.agent.gateway import tree
    from slime.agent.gateway.conversations import Conversations

    compared = []
    same = tree.same_message
    monkeypatch.setattr(tree, "same_message", lambda ours, theirs: compared.append(1) or same(ours, theirs))
    conversations, root = Conversations(), tree.MessageNode()
    history, per_turn = [{"role": "user", "content": "go"}], []
    for k in range(12):
        del compared[:]
        found = conversations.continued(history, None)
        assert (found is None) if k == 0 else found[1] == len(history) - 1
        path = tree.walk(root, history)  # from the root each time: `echo` alone keeps the comparisons down
        assert len(path) == (0 if k == 0 else len(history) - 1)
        node = path[-1] if path else root
        answer = {"role": "assistant", "content": f"answer {k}", "reasoning_content": "hm"}
        for m in [*history[len(path) :], answer]:
            node = node.add_child(tree.MessageNode(role=m["role"], message=m))
        conversations.add(history, answer, None, [1, 2], [3])
        per_turn.append(len(compared))
        echo = {"role": "assistant", "content": f"answer {k}"}  # the client's copy, without the reasoning
        history = [*history, echo, {"role": "user", "content": f"next {k}"}]
    assert per_turn[0] == 0 and max(per_turn[1:]) <= 2, per_turn  # not 1, 2, ... 11 per walk
    prefix, covered = conversations.continued(history, None)
    assert covered == len(history) - 1 and prefix.output_ids == [3]

    edited = [*history[:1], {"role": "assistant", "content": "answer 0 edited"}, *history[2:]]
    del compared[:]
    assert conversations.continued(edited, None) is None and compared  # compared, and not the answer: no prefix
