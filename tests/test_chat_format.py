"""The chat format's tool side: reading the model's tool calls, writing tool turns as template tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.tools.chat_format import (
    PARSERS,
    ChatDelta,
    HermesParser,
    ParseError,
    ToolCall,
    check_append_only,
    conversation_drift,
    get_parser,
)
from slime.tools.registry import load_tool_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from slime.testing.tiny_model import qwen_tokenizer_dir

    return AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))


# ---- reading: the model's tool calls -------------------------------------------------------------------------------------
def test_hermes_parser_several_calls_and_errors():
    p = get_parser("hermes")
    assert {"hermes", "qwen"} <= set(PARSERS)
    text = (
        'I will check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call>'
        '<tool_call>{"name": "c", "arguments": {"x": }</tool_call>'
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "d", "arguments": {"x"'
    )
    r = p.parse(text, cut_off=True)
    assert r.content == "I will check."
    assert [(c.name, c.arguments) for c in r.calls] == [("a", {"x": 1}), ("b", {"y": 2})]
    assert [e.kind for e in r.errors] == ["malformed_json", "bad_call", "cut_off"]
    assert [type(i) for i in r.items] == [ToolCall, ToolCall, ParseError, ParseError, ParseError]
    assert p.parse(text, cut_off=False).errors[-1].kind == "unclosed"
    assert p.parse("no calls here").items == []
    assert p.parse("x</tool_call>").errors[0].kind == "unmatched_close"
    with pytest.raises(ValueError, match="unknown parser"):
        get_parser("nope")


def test_hermes_writes_what_it_reads():
    p = HermesParser()
    text = "Sure." + "".join("\n" + HermesParser.call_text(n, a) for n, a in [("a", {"x": [1, 2]}), ("b", {})])
    r = p.parse(text)
    assert r.content == "Sure." and r.errors == []
    assert [(c.name, c.arguments, c.index) for c in r.calls] == [("a", {"x": [1, 2]}, 0), ("b", {}, 1)]
    listing = HermesParser.tools_text([{"type": "function", "function": {"name": "a"}}])
    assert '{"type": "function", "function": {"name": "a"}}' in listing
    assert listing.endswith('<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def test_errors_keep_the_models_order_and_text():
    r = get_parser("qwen3").parse('</tool_call><tool_call>[1]</tool_call><tool_call>{"name": "a"}<tool_call> {"x"')
    assert [(type(i).__name__, getattr(i, "kind", None), i.index) for i in r.items] == [
        ("ParseError", "unmatched_close", 0),
        ("ParseError", "bad_call", 1),
        ("ParseError", "unclosed", 2),
        ("ParseError", "unclosed", 3),
    ]
    assert [e.raw for e in r.errors] == ["</tool_call>", "[1]", '{"name": "a"}', ' {"x"']
    assert r.errors[1].message == "a tool call must be a JSON object with 'name' and 'arguments'"


# ---- writing: the template's tokens -----------------------------------------------------------------------
def test_qwen3_template_append_only_for_thinking_turns(tok):
    tools = load_tool_config(ROOT / "configs" / "example_tool.yaml").schemas()
    d = ChatDelta(tok)
    assert d.eot_text == "<|im_end|>\n" and d.stop_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert check_append_only(d, tools).ok


def test_drifting_template_is_reported(tok):
    # Qwen3 without thinking drops the empty <think> block of past turns: history changes.
    rep = check_append_only(ChatDelta(tok, {"enable_thinking": False}), [])
    assert not rep.ok and rep.turn == 1 and "<think>" in rep.detail


def test_template_without_tool_support(tok):
    """A ChatML template that ignores `tools` and `tool_calls`: schemas go to the system message,
    model turns are kept as raw text, and the result is still append-only."""

    class Plain:
        all_special_ids, eos_token_id, chat_template = tok.all_special_ids, tok.eos_token_id, "plain"

        def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False, **kw):
            out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
            return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")

        def encode(self, text, add_special_tokens=False):
            return tok.encode(text, add_special_tokens=False)

        def decode(self, ids, **kw):
            return tok.decode(ids, **kw)

    d = ChatDelta(Plain())
    assert not d.renders_tools and not d.renders_tool_calls
    tools = load_tool_config(ROOT / "configs" / "gsm8k_tool.yaml").schemas()
    text = tok.decode(
        d.prompt_ids([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], tools)
    )
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools") and '"calc_gsm8k_reward"' in text
    assert d.assistant_message("c", [("a", {})], "c\n<tool_call>x</tool_call>")["content"].endswith("</tool_call>")
    assert check_append_only(d, tools).ok


def test_tool_turn_delta_and_drift_of_a_finished_conversation(tok):
    d = ChatDelta(tok, {"enable_thinking": True})
    msgs = [{"role": "user", "content": "3 + 4?"}]
    ids = d.prompt_ids(msgs)
    prompt_len = len(ids)
    model = d.encode("<think>\nadd\n</think>\n\n" + HermesParser.call_text("calc", {"e": "3+4"})) + [d.stop_id]
    tool_msgs = [{"role": "tool", "name": "calc", "content": "7"}]
    ids += model + d.tool_delta_ids(tool_msgs, model)
    assert tok.decode(ids[prompt_len + len(model) :]) == (
        "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    final = "<think>\ndone\n</think>\n\nIt is 7."
    ids += d.encode(final) + [d.stop_id]
    parsed = get_parser("hermes").parse(tok.decode(model[:-1]))
    assert parsed.content == "<think>\nadd\n</think>\n" and [c.name for c in parsed.calls] == ["calc"]
    msgs += [
        d.assistant_message(parsed.content, [(c.name, c.arguments) for c in parsed.calls], tok.decode(model[:-1])),
        *tool_msgs,
        d.assistant_message(final, [], final),
    ]
    assert conversation_drift(d, msgs, None, ids, prompt_len).ok
    changed = list(ids)
    changed[prompt_len + 3] = tok.convert_tokens_to_ids("<|im_start|>")
    rep = conversation_drift(d, msgs, None, changed, prompt_len)
    assert not rep.ok and rep.position == 3  # counted from the start of the response


TEXTS = st.lists(
    st.one_of(
        st.text(max_size=20),
        st.sampled_from(["<|im_start|>", "<|im_end|>", "<tool_call>", "<think>", "\n", "  ", "é😀"]),
    ),
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(TEXTS, st.booleans())
def test_the_template_text_is_tokenised_as_the_tokenizer_does_even_after_a_truncating_call(tok, parts, truncated):
    """`ChatDelta.encode` reads the Rust tokenizer directly (a gateway turn's cost), and gives what
    `tok.encode(text, add_special_tokens=False)` does: also after a call that left truncation set on
    that Rust tokenizer, which the HF call resets and a direct read would apply."""
    delta = ChatDelta(tok)
    text = "".join(parts)
    if truncated:
        tok("some text that is long enough", truncation=True, max_length=2)
    assert delta.encode(text) == tok.encode(text, add_special_tokens=False)


def test_a_template_text_is_tokenised_without_the_hf_wrapper_when_nothing_is_set(tok, monkeypatch):
    """The direct read is taken (half the CPU of a short text's `tok.encode`, each gateway turn pays it),
    and given up once a call left truncation set."""
    delta = ChatDelta(tok)
    calls = []
    real = tok.encode
    monkeypatch.setattr(tok, "encode", lambda *a, **k: calls.append(a) or real(*a, **k))
    text = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert delta.encode(text) == real(text, add_special_tokens=False) and len(calls) == 0
    tok("some text that is long enough", truncation=True, max_length=2)
    assert delta.encode(text) == real(text, add_special_tokens=False) and len(calls) == 1
