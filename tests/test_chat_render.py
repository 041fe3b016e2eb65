"""`TemplateRender` renders exactly what `apply_chat_template` renders, in the same sandbox, and
falls back to it wherever a probe differs."""

from __future__ import annotations

import copy
import enum

import jinja2
import jinja2.runtime
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from slime.testing.tiny_model import qwen_tokenizer_dir
from slime.tools.chat_format import ChatDelta, decode_text, plain_decoder
from slime.tools.chat_render import TemplateRender, _plain_template_data, memoized_safety, plain_data, plain_lookups
from jinja2.sandbox import ImmutableSandboxedEnvironment

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


class Colour(str, enum.Enum):  # a str subclass, as enum values in a caller's messages are
    RED = "red"


class Opaque:  # anything a template must not see: HF's placeholder "<Opaque>"
    pass


def shape(value):
    """The value with the type of every part, so `1`, `1.0`, `True` and "red" vs Colour.RED differ."""
    if isinstance(value, dict):
        return ("dict", sorted((shape(k), shape(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [shape(v) for v in value])
    return (type(value).__name__, repr(value))


leaf = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | text
    | st.just(Colour.RED)
    | st.builds(Opaque)
)
template_data = st.recursive(
    leaf,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(text | st.integers(0, 3) | st.just(Colour.RED), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(value=template_data)
def test_plain_data_is_hfs_copy(value):
    """The fast copy of a template's inputs is HF's own, type for type, for JSON and anything else."""
    assert shape(plain_data(value)) == shape(_plain_template_data(value))


class ValueAware(ImmutableSandboxedEnvironment):
    """A sandbox whose answer depends on the object's value, not only on its type."""

    def is_safe_attribute(self, obj, attr, value):
        return obj != "secret" and super().is_safe_attribute(obj, attr, value)


def test_safety_answers_kept_only_where_jinja_gives_them():
    env = ValueAware()
    memoized_safety(env)  # not jinja's own answer: asked every time
    template = env.from_string("{{ a.upper() }}|{{ b.upper() }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        template.render(a="public", b="secret")

    env = ImmutableSandboxedEnvironment()
    reference = ImmutableSandboxedEnvironment()
    memoized_safety(env)
    namespace = jinja2.utils.Namespace
    objects = [
        namespace(found=True),
        namespace(found=False, n=2),
        jinja2.runtime.LoopContext(iter([1, 2]), jinja2.Undefined),
        jinja2.runtime.LoopContext(iter([]), jinja2.Undefined),
        "s",
        {"k": 1},
        [1],
    ]
    names = [
        "found",
        "n",
        "index0",
        "first",
        "last",
        "cycle",
        "__class__",
        "_after",
        "__init__",
        "mro",
        "upper",
        "append",
        "update",
        "pop",
        "items",
    ]
    for _ in range(2):  # the second pass reads the kept answers
        for obj in objects:
            for name in names:
                value = getattr(obj, name, None)
                assert env.is_safe_attribute(obj, name, value) == reference.is_safe_attribute(obj, name, value)


def _rendered(env, source: str, data: dict) -> tuple:
    try:
        return "text", env.from_string(source).render(**data)
    except Exception as e:  # noqa: BLE001 - the refusal itself is compared
        return "refused", type(e).__name__, str(e)


def test_plain_lookups_answer_as_the_sandbox():
    """Dict keys and plain str method calls taken directly give the sandbox's own values and
    refusals: a name dict has is its attribute (`items`, `update`: refused by the immutable sandbox),
    a missing key is undefined, `format`/`format_map` stay the sandbox's (`__class__` refused), other
    types and callables take the sandbox's way; an environment class of its own is left alone."""
    env, reference = ImmutableSandboxedEnvironment(), ImmutableSandboxedEnvironment()
    plain_lookups(env)
    assert {"getattr", "call"} <= set(vars(env))  # the direct ways are in place
    data = {
        "m": {"role": "user", "items": "a key", "content": "hi", "get": 3},
        "s": "a,b",
        "l": [{"content": "xyz"}, {"content": "z"}],
        "n": 5,
    }
    templates = [
        "{{ m.role }}|{{ m.missing is defined }}|{{ m.items is defined }}|{{ m['items'] }}|{{ m.get('role') }}",
        "{{ m.keys() | list }}|{{ m.content.upper() }}|{{ s.startswith('a') }}|{{ s.split(',') }}",
        "{{ s.rsplit(',', maxsplit=1) }}|{{ s.strip(None) }}|{{ n.bit_length() }}",
        "{% for x in l %}{{ loop.index0 }}{{ x.content.endswith('z') }}{% endfor %}",
        "{% set ns = namespace(k=0) %}{% for x in l %}{% set ns.k = ns.k + 1 %}{% endfor %}{{ ns.k }}",
        "{{ '{0}-{1}'.format(s, n) }}|{{ '{role}'.format_map(m) }}",
        "{{ '{0.__class__}'.format(s) }}",
        "{{ m.update({'x': 1}) }}",
        "{{ s.__class__ }}|{{ m.__class__.__mro__ }}",
        "{{ s.__class__.__mro__[1].__subclasses__() }}",
        "{{ m.missing.deeper }}",
    ]
    for source in templates:
        assert _rendered(env, source, data) == _rendered(reference, source, data), source

    class Own(ImmutableSandboxedEnvironment):
        def getattr(self, obj, attribute):
            return "own"

    own = Own()
    plain_lookups(own)
    assert "getattr" not in vars(own) and own.from_string("{{ m.role }}").render(m={"role": "user"}) == "own"
