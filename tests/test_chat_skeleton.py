"""A render served by a skeleton (`chat_skeleton`) is exactly `apply_chat_template`'s text: for
texts that take the skeleton's path, for texts that flip one of its guards, and for templates that
do with a text what the trace cannot follow (those are rendered whole)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from slime.testing.tiny_model import qwen_tokenizer_dir
from slime.tools.chat_render import TemplateRender

# each: what a template may do with a message's text; `kept` whether its path can be a skeleton
TEMPLATES = {
    "emit": ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}", True),
    "plus": ("{% for m in messages %}{{ '[' + m.role + ']' + m.content + '\\n' }}{% endfor %}", True),
    "tilde": ("{% for m in messages %}{{ m.role ~ ':' ~ m.content ~ ';' }}{% endfor %}", True),
    "startswith": (
        "{% for m in messages %}{% if m.content.startswith('<tool_response>') and m.content.endswith('>') %}"
        "T{% else %}U{% endif %}{{ m.content }}{% endfor %}",
        True,
    ),
    "in-literal": (
        "{% for m in messages %}{% if m.content in 'yes no' %}YN{% endif %}{{ m.content }}{% endfor %}",
        True,
    ),
    "not-in-literal": (
        "{% for m in messages %}{% if m.content not in 'yes' %}!{% endif %}{{ m.content }}{% endfor %}",
        True,
    ),
    "contains": (
        "{% for m in messages %}{% if '</think>' in m.content %}R{% endif %}{{ m.content }}{% endfor %}",
        True,
    ),
    "in-list": (
        "{% for m in messages %}{% if m.content in ['a', 'b'] %}AB{% endif %}{{ m.content }}{% endfor %}",
        True,
    ),
    "equal": (
        "{% for m in messages %}{% if m.content == '' %}empty{% else %}{{ m.content }}{% endif %}{% endfor %}",
        True,
    ),
    "truth": ("{% for m in messages %}{% if m.content %}[{{ m.content }}]{% endif %}{% endfor %}", True),
    "length": ("{% for m in messages %}{{ m.content | length }}:{{ m.content }}{% endfor %}", True),
    "concat-then-compare": (
        "{% for m in messages %}{% set x = m.role ~ m.content %}{% if x == 'usera' %}A{% endif %}{{ x }}{% endfor %}",
        True,
    ),
    "block-set": (
        "{% for m in messages %}{% set x %}({{ m.content }}){% endset %}{% if x == '(a)' %}A{% endif %}{{ x }}"
        "{% endfor %}",
        True,
    ),
    "macro": (
        "{% macro show(c) %}<{{ c }}>{% endmacro %}{% for m in messages %}{% set s = show(m.content) %}"
        "{% if s.startswith('<a') %}A{% endif %}{{ s }}{% endfor %}",
        True,
    ),
    "namespace": (
        "{% set ns = namespace(last='') %}{% for m in messages %}{% set ns.last = m.content %}{% endfor %}"
        "{{ ns.last }}{% if ns.last.endswith('?') %}Q{% endif %}",
        True,
    ),
    "trim": (
        "{% for m in messages %}{{ '<' + m.content | trim + '>' }}{% if m.content|trim %}!{% endif %}{% endfor %}",
        True,
    ),
    "strip": (
        "{% set first = messages[0].content.strip() + '\\n\\n' %}{% for m in messages %}"
        "{% set c = (first + m.content) if loop.first else m.content %}[{{ c.lstrip(' a') }}|{{ c.rstrip() }}]"
        "{% if c.strip().startswith('<') %}L{% endif %}{% endfor %}",
        True,
    ),
    "movers": (
        "{% set users = messages | selectattr('role', 'equalto', 'user') | list %}{% if users %}"
        "{{ (users | last).content }}{{ users | map(attribute='content') | map('trim') | list | length }}{% endif %}"
        "{{ (messages | first).content | default('none', true) }}{% for m in messages | reverse %}{{ m.content }}"
        "{% endfor %}{% if messages | selectattr('content', 'equalto', 'a') | list %}A{% endif %}",
        True,
    ),
    # what the trace does not follow: rendered whole, every time
    "join": ("{{ messages | map(attribute='content') | join('|') }}", False),
    "strip-a-text": ("{% for m in messages %}{{ 'abc'.strip(m.content) }}{% endfor %}", False),
    "tojson": ("{% for m in messages %}{{ m.content | tojson }}{% endfor %}", False),
    "tojson-of-messages": ("{{ messages | tojson }}", False),
    "slice": ("{% for m in messages %}{{ m.content[:2] }}{% endfor %}", False),
    "split": ("{% for m in messages %}{{ m.content.split('</think>')[-1] }}{% endfor %}", False),
    "upper": ("{% for m in messages %}{{ m.content.upper() }}{% endfor %}", False),
    "iterate": ("{% for m in messages %}{% for c in m.content %}{{ c }}.{% endfor %}{% endfor %}", False),
    "percent": ("{% for m in messages %}{{ '%s!' % m.content }}{% endfor %}", False),
    "percent-of-a-message": (  # (the text copied by C into a plain string, then asked a question)
        "{% for m in messages %}{% if m.role == 'assistant' %}{% set s = '%(content)s' % m %}"
        "{% if s.startswith('b') %}B{% endif %}{% endif %}{% endfor %}",
        False,
    ),
    "times": ("{% for m in messages %}{{ m.content * 2 }}{% endfor %}", False),
    "dict-key": ("{% for m in messages %}{{ {'a': 'A'}.get(m.content, '-') }}{% endfor %}", False),
    "literal-method": (  # (the answer is wrong for some texts only: the trace must stop, not guess)
        "{% for m in messages %}{% if m.role == 'assistant' %}{{ 'abc'.startswith(m.content) }}{% endif %}{% endfor %}",
        False,
    ),
    "test-in": ("{% for m in messages %}{% if m.content is in 'abc' %}I{% endif %}{{ m.content }}{% endfor %}", False),
    "two-texts": (
        "{% for m in messages %}{% if m.content == messages[0].content %}={% endif %}{{ m.content }}{% endfor %}",
        False,
    ),
    "chain": ("{% for m in messages %}{% if 'a' in m.content in 'xa' %}C{% endif %}{{ m.content }}{% endfor %}", False),
    "macro-then-trim": (
        "{% macro show(c) %} {{ c }} {% endmacro %}{% for m in messages %}{{ show(m.content) | trim }}{% endfor %}",
        True,
    ),
    "macro-then-upper": (
        "{% macro show(c) %} {{ c }} {% endmacro %}{% for m in messages %}{{ show(m.content) | upper }}{% endfor %}",
        False,
    ),
}
TEXTS = ["a", "b", "yes", "no", "", " a ", "x?", "<tool_response>", "<tool_response>7</tool_response>", "r</think>a"]
TEXTS += ["\ue000", "\ue0000\ue001", "usera", "(a)", "<a>"]
text = st.sampled_from(TEXTS) | st.text(max_size=6)


@pytest.fixture(scope="module")
def qwen():
    return AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))


@pytest.fixture(scope="module")
def renders(qwen):
    out = {}
    for name, (template, _) in TEMPLATES.items():
        tok = copy.copy(qwen)  # (its own template; the tokenizer itself shared)
        tok.chat_template = template
        render = TemplateRender(tok)
        assert render.agrees(), name
        out[name] = render
    out["qwen3"] = render = TemplateRender(copy.copy(qwen))
    assert render.agrees()
    return out


def outcome(render, *args):
    try:
        return "text", render(*args)
    except Exception as e:  # noqa: BLE001 - a template refusing a conversation: both must refuse it
        return "error", type(e).__name__


def shape_paths(render) -> list[int]:
    return [len(shape.paths) for skeletons in render._skeletons.values() for shape in skeletons._shapes.values()]


@settings(max_examples=120, deadline=None)
@given(
    name=st.sampled_from([*TEMPLATES, "qwen3"]),
    roles=st.lists(st.sampled_from(["system", "user", "assistant", "tool"]), min_size=1, max_size=3),
    fillings=st.lists(st.data(), min_size=3, max_size=3),
    gen=st.booleans(),
)
def test_every_render_is_apply_chat_templates_text(renders, name, roles, fillings, gen):
    """One shape, several fillings of its texts: the first is traced, the later ones served by its
    skeleton where their guards agree, rendered whole where not; each is HF's text."""
    render = renders[name]
    for data in fillings:
        messages = [{"role": r, "content": data.draw(text)} for r in roles]
        assert outcome(render.render, messages, None, gen) == outcome(render.reference, messages, None, gen)


@pytest.mark.parametrize("name", TEMPLATES)
def test_what_the_trace_follows_is_kept_and_the_rest_is_not(qwen, name):
    template, kept = TEMPLATES[name]
    tok = copy.copy(qwen)
    tok.chat_template = template
    render = TemplateRender(tok)  # (its own: no other test's shapes in it)
    for t in TEXTS:
        messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": t}]
        assert render.render(messages, None, True) == render.reference(messages, None, True)
    paths = sum(shape_paths(render))
    assert (paths > 0) == kept
    if kept:
        assert sum(s.hits for s in render._skeletons.values()) > 0  # later texts were served by a skeleton


def test_qwen3_first_prompts_are_served_by_a_skeleton_and_tool_responses_take_their_own_path(qwen):
    render = TemplateRender(copy.copy(qwen))
    assert render.agrees()
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]
    for i in range(20):
        for content in (f"task {i}", f"<tool_response>{i}</tool_response>"):
            messages = [{"role": "system", "content": f"You are agent {i}."}, {"role": "user", "content": content}]
            assert render.render(messages, tools, True) == render.reference(messages, tools, True)
    (skeletons,) = render._skeletons.values()
    # one shape, two paths, each traced once: the shape's first render is not traced (a shape met once costs
    # no trace), the second (a tool response) is, and the third (a task again) takes the other path
    assert skeletons.traces == 2 and skeletons.hits == 37


def test_templates_that_read_the_clock_or_random_numbers_are_never_kept(qwen):
    tok = copy.copy(qwen)
    for template in (
        "{{ strftime_now('%Y-%m-%d %H:%M:%S.%f') }}{% for m in messages %}{{ m.content }}{% endfor %}",
        "{{ range(1000) | random }}{% for m in messages %}{{ m.content }}{% endfor %}",
        "{{ lipsum(1) }}{% for m in messages %}{{ m.content }}{% endfor %}",
    ):
        tok.chat_template = template
        render = TemplateRender(tok)
        for i in range(3):
            render.render([{"role": "user", "content": f"u{i}"}], None, True)
        assert sum(shape_paths(render)) == 0, template


def test_a_marker_copied_where_the_trace_did_not_look_stops_the_trace():
    """Belt and braces: a plain text carrying a marker (a copy the trace did not see) is treated as
    a traced text by every filter, test and call, and a skeleton with one in a literal is refused."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from slime.tools.chat_skeleton import (
        MARK_CLOSE,
        MARK_OPEN,
        Skeleton,
        Untraceable,
        _has_symbolic,
        tracing_environment,
    )

    copied = f"x{MARK_OPEN}0{MARK_CLOSE}"
    assert _has_symbolic(["a", {"k": copied}]) and not _has_symbolic(["a", {"k": "x"}])
    tracing = tracing_environment(ImmutableSandboxedEnvironment())
    for obj, args in ((copied.startswith, ("x",)), ("abc".startswith, (copied,))):
        with pytest.raises(Untraceable):
            tracing.call(None, obj, *args)
    assert Skeleton.of(f"a{MARK_OPEN}0{MARK_CLOSE}b", []) is None
    assert Skeleton.of("ab", []).fill(()) == "ab"
