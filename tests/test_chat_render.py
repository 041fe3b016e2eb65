"""`TemplateRender` renders exactly what `apply_chat_template` renders, in the same sandbox, and
falls back to it wherever a probe differs."""

from __future__ import annotations

import copy

import jinja2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from slime.testing.tiny_model import qwen_tokenizer_dir
from slime.tools.chat_format import ChatDelta, decode_text, plain_decoder
from slime.tools.chat_render import TemplateRender

# a second template: namespace, loop variables, filters, tojson of the tools, a system default
OTHER_TEMPLATE = (
    "{%- set ns = namespace(n=0) -%}"
    "{%- if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif -%}"
    "{%- for m in messages -%}{%- set ns.n = ns.n + 1 -%}"
    "[{{ loop.index }}:{{ m.role | upper }}{% if m.name is defined %}/{{ m.name }}{% endif %}]"
    "{% if m.reasoning_content %}<r>{{ m.reasoning_content | trim }}</r>{% endif %}"
    "{{ m.content if m.content is string else m.content | tojson }}"
    "{% for c in m.tool_calls or [] %}<call>{{ c.function | tojson }}</call>{% endfor %}<|im_end|>"
    "{%- endfor -%}{% if add_generation_prompt %}[{{ ns.n }}:ASSISTANT]{% endif %}{{ eos_token }}"
)


@pytest.fixture(scope="module")
def tokenizers():
    qwen, other = (AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir())) for _ in range(2))
    other.chat_template = OTHER_TEMPLATE
    return {name: (tok, TemplateRender(tok)) for name, tok in (("qwen", qwen), ("other", other))}


text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12) | st.sampled_from(
    ["<tool_response>\n7\n</tool_response>", "<think>\nr\n</think>\n\nA", "  padded  ", "", "<|im_end|>"]
)
call = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {
                "name": st.sampled_from(["lookup", "read_file"]),
                "arguments": st.dictionaries(st.sampled_from(["q", "path"]), st.integers(0, 9) | text, max_size=2),
            }
        ),
    }
)
message = st.one_of(
    st.fixed_dictionaries({"role": st.just("user"), "content": text}, optional={"name": st.none() | text}),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": text},
        optional={"reasoning_content": st.none() | text, "tool_calls": st.lists(call, max_size=2)},
    ),
    st.fixed_dictionaries({"role": st.just("tool"), "content": text}),
)
tool = st.builds(
    lambda name: {
        "type": "function",
        "function": {
            "name": name,
            "description": "d",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    },
    st.sampled_from(["lookup", "read_file"]),
)
conversation = st.tuples(st.booleans(), st.lists(message, min_size=1, max_size=5)).map(
    lambda t: ([{"role": "system", "content": "S"}] if t[0] else []) + t[1]
)


def outcome(render, *args):
    try:
        return "text", render(*args)
    except Exception as e:  # noqa: BLE001 - a template refusing a conversation: both must refuse it
        return "error", type(e).__name__


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["qwen", "other"]),
    messages=conversation,
    tools=st.none() | st.lists(tool, max_size=2),
    gen=st.booleans(),
)
def test_fast_render_is_apply_chat_templates_text(tokenizers, name, messages, tools, gen):
    render = tokenizers[name][1]
    assert render.agrees() and render.fast
    before = copy.deepcopy(messages)
    assert outcome(render.render, messages, tools, gen) == outcome(render.reference, messages, tools, gen)
    assert messages == before  # the caller's messages are not touched


def test_sandbox_kept_and_a_differing_tokenizer_falls_back(tokenizers):
    tok = tokenizers["qwen"][0]
    kept = tok.chat_template
    tok.chat_template = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    try:
        render = TemplateRender(tok)
        render.fast = True  # even forced onto the fast path, the template runs in jinja's sandbox
        with pytest.raises(jinja2.exceptions.SecurityError):
            render.render([{"role": "user", "content": "U"}])
    finally:
        tok.chat_template = kept

    class Customised(type(tok)):  # a tokenizer class that renders its own way
        def apply_chat_template(self, *args, **kwargs):
            return "<custom>" + super().apply_chat_template(*args, **kwargs)

    custom = Customised.from_pretrained(str(qwen_tokenizer_dir()))
    render = TemplateRender(custom)
    assert not render.agrees()
    assert render.render([{"role": "user", "content": "U"}], None, True).startswith("<custom>")
    assert ChatDelta(custom).render([{"role": "user", "content": "U"}]).startswith("<custom>")


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(0, 151668), max_size=20))
def test_decode_text_is_the_tokenizers_decode(tokenizers, ids):
    tok = tokenizers["qwen"][0]
    backend = plain_decoder(tok)
    assert backend is not None
    assert decode_text(tok, backend, ids) == tok.decode(ids, skip_special_tokens=False)
