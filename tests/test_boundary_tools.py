"""Two tool-loop boundaries, hypothesis-generated: the model's output read for tool calls (the
hermes parser, and `parse_model_output` of the agent gateway) and the tool YAML loader. Model text
with any mix of tags, JSON, deep nesting and escaped lone surrogates parses into text, calls and
errors -- never an exception, never a string the tokenizer cannot take back. A YAML file that is
not a tool config is a `ToolConfigError` naming the file (and the line, for a syntax error)."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from slime.agent.gateway.parsing import parse_model_output
from slime.tools.chat_format import get_parser
from slime.tools.registry import ToolConfigError, load_tool_config

FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "\n",
    '{"name": "add", "arguments": {"a": 1}}',
    '{"name": ',
    '"add"',
    '"arguments": ',
    '"\\ud800"',
    '"\\udc00x"',
    "[" * 3000,
    "{",
    "}",
    "null",
    "[1, 2]",
    '"',
    "<think>",
    "</think>",
    "<function=add>",
    "<parameter=a>",
    "</parameter>",
    "</function>",
]
model_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6)), max_size=12).map("".join)
ADD = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]


def encodable(value) -> bool:
    """Every string inside `value` is UTF-8 text (what a tokenizer or a JSON body can carry)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(encodable(k) and encodable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(encodable(v) for v in value)
    return True


@settings(max_examples=150, deadline=None)
@given(text=model_text, cut_off=st.booleans())
@example(text="<tool_call>" + "[" * 5000 + "</tool_call>", cut_off=False)
@example(text='<tool_call>{"name": "add", "arguments": {"a": "\\ud800"}}</tool_call>', cut_off=False)
@example(text='<tool_call>{"name": "a\\udc00", "arguments": "{\\"a\\": 1}"}</tool_call>', cut_off=False)
def test_the_hermes_parser_reads_any_model_text_without_raising(text, cut_off):
    result = get_parser("hermes").parse(text, cut_off=cut_off)
    assert isinstance(result.content, str) and text.startswith(result.content)
    for call in result.calls:
        assert isinstance(call.name, str) and call.name
        assert encodable(call.name) and encodable(call.arguments), call
    assert all(
        e.kind in {"unclosed", "unmatched_close", "cut_off", "malformed_json", "bad_call"} for e in result.errors
    )
    assert len(result.calls) + len(result.errors) == len(result.items)


@settings(max_examples=100, deadline=None)
@given(text=model_text, parser=st.sampled_from(["hermes", None]), reasoning=st.sampled_from(["qwen3", None]))
@example(text="<tool_call>" + "[" * 5000 + "</tool_call>", parser="hermes", reasoning=None)
def test_the_gateway_reads_any_model_text_without_raising(text, parser, reasoning):
    out = parse_model_output(text, tools_schema=ADD, tool_parser_name=parser, reasoning_parser_name=reasoning)
    assert encodable([out.text, out.reasoning]) or not encodable(text)
    for use in out.tool_uses:
        assert isinstance(use["name"], str) and isinstance(use["input"], dict)
        assert encodable(use), use


# ------------------------------------------------------------------ the tool YAML loader

yaml_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
yaml_data = st.recursive(
    yaml_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["tools", "class_name", "config", "tool_schema", "mcp", "type", "function", "name", "x"]),
            inner,
            max_size=3,
        )
    ),
    max_leaves=10,
)
GOOD_ENTRY = {
    "class_name": "slime.tools.example_tools.CalculatorTool",
    "tool_schema": {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "d",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
}


def loaded_or_refused_naming_the_file(path) -> str:
    try:
        load_tool_config(path)
    except ToolConfigError as e:
        assert str(e).startswith(f"{path}: "), str(e)
        return str(e)
    return "loaded"


@settings(max_examples=60, deadline=None)
@given(
    data=st.one_of(
        yaml_data,
        st.builds(lambda e: {"tools": [e]}, yaml_data),
        st.builds(
            lambda k, v: {"tools": [{**GOOD_ENTRY, k: v}]},
            st.sampled_from(["class_name", "config", "tool_schema", "mcp"]),
            yaml_data,
        ),
    )
)
def test_any_yaml_data_is_a_tool_set_or_an_error_naming_the_file(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("yaml") / "tools.yaml"
    path.write_text(yaml.safe_dump(data))
    loaded_or_refused_naming_the_file(path)


@settings(max_examples=60, deadline=None)
@given(raw=st.one_of(st.binary(max_size=60), st.text(max_size=60).map(str.encode)))
@example(raw=b"tools:\n  - class_name: [unclosed\n")
@example(raw=b"tools:\n\t- class_name: x\n")
@example(raw=b"tools: [" + b"[" * 5000)
@example(raw=b"tools:\n  - class_name: \xff\xfe\n")
def test_bytes_that_are_not_yaml_are_refused_naming_the_file_and_line(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("yaml") / "tools.yaml"
    path.write_bytes(raw)
    message = loaded_or_refused_naming_the_file(path)
    if "invalid YAML" in message and "nested too deeply" not in message:
        assert "line " in message, message


def test_a_yaml_syntax_error_names_its_line(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - class_name: x\n    config: [a, b\n")
    with pytest.raises(ToolConfigError) as e:
        load_tool_config(path)
    assert str(e.value).startswith(f"{path}: invalid YAML at line ")


def test_bytes_that_are_not_utf8_are_named_with_their_line(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_bytes(b"tools:\n  - class_name: \xff\n")
    with pytest.raises(ToolConfigError) as e:
        load_tool_config(path)
    assert str(e.value) == f"{path}: line 2: not UTF-8 text (byte 0xff at column 17)"


def test_the_good_entry_loads(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": [GOOD_ENTRY]}))
    assert list(load_tool_config(path).tools) == ["calc"]
    assert json.loads(json.dumps(GOOD_ENTRY))  # (the entry is plain data)
