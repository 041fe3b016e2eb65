"""A body's strings are checked for lone surrogates and its nesting for `MAX_DEPTH` by one walk that
builds no path (`body_checks._plain`); only a body that fails is walked again to name the field. The
shortcut never changes an answer: hypothesis draws bodies with surrogates in keys and values at any
place and nesting around the limit, and `no_lone_surrogates` must raise exactly what the path-naming
walk raises (same field, same message), or pass where it passes."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from slime.agent.gateway.errors import FieldError
from slime.agent.gateway.protocols import openai_chat
from slime.agent.gateway.protocols.body_checks import (
    MAX_DEPTH,
    _named_walk,
    no_lone_surrogates,
    plain_text,
    strings_past,
)
from slime.agent.gateway.protocols.body_prefix import BodyPrefixes

TEXT = st.text(max_size=6) | st.text(max_size=4).map(lambda s: s + "\ud800") | st.just("\udfff tail")
KEYS = st.sampled_from(["role", "content", "messages", "a\udc00", "x"])
LEAF = st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | TEXT
JSON = st.recursive(
    LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3), max_leaves=12
)


@st.composite
def nested(draw: st.DrawFn) -> object:
    """A JSON value, sometimes wrapped in lists/objects to a depth around `MAX_DEPTH`."""
    value = draw(JSON)
    levels = draw(st.sampled_from([0, 0, 1, 3, MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1]))
    shape = draw(st.sampled_from(["list", "object", "both"]))
    for i in range(levels):
        value = [value] if shape == "list" or (shape == "both" and i % 2) else {f"k{i % 3}": value}
    return value


def outcome(check, *args) -> tuple[str, str] | None:
    try:
        check(*args)
    except FieldError as e:
        return e.param, str(e)
    return None


@settings(max_examples=150, deadline=None)
@given(nested(), st.integers(0, 2))
def test_the_unnamed_walk_answers_as_the_named_one(value, depth):
    assert outcome(no_lone_surrogates, value, "body", depth) == outcome(_named_walk, value, "body", depth)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(KEYS, nested(), max_size=3), st.lists(nested(), max_size=4), st.integers(0, 4))
def test_a_history_checked_past_its_known_part_answers_as_before(body, history, checked):
    body = {**body, "messages": history}

    def named_past(b: dict, key: str, skip: int) -> None:  # strings_past's order and paths, named walk only
        for k, v in b.items():
            _named_walk(k, "body", 1)
            if k == key:
                for i in range(skip, len(v)):
                    _named_walk(v[i], f"{k}[{i}]", 2)
            else:
                _named_walk(v, k, 1)

    assert outcome(strings_past, body, "messages", checked) == outcome(named_past, body, "messages", checked)


def test_each_refusal_names_its_field():
    assert outcome(no_lone_surrogates, {"messages": [{"content": "ok"}, {"content": "bad\ud83d"}]}) == (
        "messages[1].content",
        "messages[1].content: contains a lone UTF-16 surrogate, which is not valid UTF-8 text",
    )
    deep: object = "x"
    for _ in range(MAX_DEPTH):
        deep = [deep]
    assert outcome(no_lone_surrogates, deep) is None  # the string sits exactly MAX_DEPTH levels down
    assert outcome(no_lone_surrogates, {"a": deep})[1].endswith(f"nested deeper than {MAX_DEPTH} levels")


@settings(max_examples=150, deadline=None)
@given(nested(), st.booleans(), st.integers(0, 2))
def test_a_text_that_looks_plain_passes_the_walk(value, ascii_only, depth):
    """`plain_text` never vouches for a value the walk refuses: whatever JSON text writes it
    (escaped or raw non-ASCII), a text read from UTF-8 that it calls plain parses to a value that
    passes. (A raw surrogate cannot be read from UTF-8: such bytes are `json.loads`' and walked.)"""
    raw = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        assert not BodyPrefixes().parse(raw, "messages", "openai_chat").strings_checked
        return
    if plain_text(text, depth):
        assert outcome(no_lone_surrogates, json.loads(text), "body", depth) is None


def test_a_plain_body_is_not_walked_and_a_surrogate_still_named(monkeypatch):
    """A body whose text holds no surrogate escape and few brackets is checked by its text alone (the
    walk is never run, first body or continued one); one with a lone surrogate is walked and refused
    naming its field, as before."""
    import slime.agent.gateway.protocols.body_checks as checks

    walked = []
    monkeypatch.setattr(checks, "_plain", lambda value, depth: walked.append(value) or True)
    sessions = BodyPrefixes()
    first = {"model": "m", "messages": [{"role": "user", "content": "héllo"}], "max_tokens": 8}
    for body in (first, {**first, "messages": [*first["messages"], {"role": "assistant", "content": "a"}]}):
        parsed = sessions.parse(json.dumps(body).encode(), "messages", "openai_chat")
        assert parsed.strings_checked
        req = openai_chat.parse_request(parsed.body, {}, "s", parsed.known, strings_checked=parsed.strings_checked)
        sessions.keep(parsed, req.known)
    assert walked == []
    bad = {**first, "messages": [*first["messages"], {"role": "user", "content": "x\ud83d"}]}
    parsed = sessions.parse(json.dumps(bad).encode(), "messages", "openai_chat")
    assert not parsed.strings_checked
    monkeypatch.undo()
    assert outcome(lambda: openai_chat.parse_request(parsed.body, {}, "s", parsed.known, strings_checked=False)) == (
        "messages[1].content",
        "messages[1].content: contains a lone UTF-16 surrogate, which is not valid UTF-8 text",
    )
