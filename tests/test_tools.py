"""Tool system without engines: registry, schemas, built-in tools, the template check at start-up
(the chat format itself: tests/test_chat_format.py)."""

from __future__ import annotations

import argparse
import logging
import textwrap
from pathlib import Path

import pytest

from slime.tools.flags import add_tool_arguments, tool_defaults
from slime.tools.chat_format import TemplateDriftError
from slime.tools.example_tools import CalculatorTool, safe_eval
from slime.tools.gsm8k_tool import Gsm8kTool, extract_number
from slime.rollout.runtime import get_tool_set
from slime.tools.registry import ToolConfigError, ToolSet, load_tool_config
from slime.tools.schemas import OpenAIFunctionToolSchema
from slime.tools.tool_sets import ToolSetCache
from tests.conftest import native_tools_yaml

ROOT = Path(__file__).resolve().parents[1]

NESTED_TOOL = native_tools_yaml(
    (
        "slime.tools.example_tools.CalculatorTool",
        "search",
        "nested schema",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "what to look for"},
                "mode": {"type": "string", "enum": ["fast", "exact"], "default": "fast"},
                "filters": {
                    "type": "object",
                    "properties": {
                        "year": {"type": "integer", "minimum": 1900},
                        "tags": {"type": "array", "items": {"type": "string"}},
                    },
                    "required": ["year"],
                },
            },
            "required": ["query"],
        },
    )
)


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from slime.testing.tiny_model import qwen_tokenizer_dir

    return AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))


def write(tmp_path: Path, text: str, name: str = "tools.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


# ---- registry -----------------------------------------------------------------------------------
def test_tools_registration():
    tools = load_tool_config(ROOT / "configs" / "gsm8k_tool.yaml")
    assert tools.names == ["calc_gsm8k_reward"]
    assert isinstance(tools["calc_gsm8k_reward"], Gsm8kTool)
    example = load_tool_config(ROOT / "configs" / "example_tool.yaml")
    assert isinstance(example["calculator"], CalculatorTool)
    # built once per owner (a runtime's `ToolSetCache`) and shared by its users
    cache = ToolSetCache()
    a = cache.get(ROOT / "configs" / "gsm8k_tool.yaml")
    assert a is cache.get(str(ROOT / "configs" / "gsm8k_tool.yaml"))
    assert a["calc_gsm8k_reward"] is cache.get(ROOT / "configs" / "gsm8k_tool.yaml")["calc_gsm8k_reward"]
    assert ToolSetCache().get(ROOT / "configs" / "gsm8k_tool.yaml") is not a  # another owner's


def test_schema_keeps_full_json_schema(tmp_path):
    tools = load_tool_config(write(tmp_path, NESTED_TOOL))
    schema = tools.schemas()[0]["function"]["parameters"]
    assert schema["properties"]["mode"] == {"type": "string", "enum": ["fast", "exact"], "default": "fast"}
    filters = schema["properties"]["filters"]
    assert filters["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
    assert filters["properties"]["year"] == {"type": "integer", "minimum": 1900}
    assert filters["required"] == ["year"]
    # round trip through the pydantic model keeps everything
    again = OpenAIFunctionToolSchema.model_validate(tools.schemas()[0]).to_openai()
    assert again == tools.schemas()[0]


def test_argument_validation(tmp_path):
    tools = load_tool_config(write(tmp_path, NESTED_TOOL))
    ok, err = tools.check_arguments("search", {"query": "x", "filters": {"year": 2000, "tags": ["a"]}})
    assert err is None and ok["mode"] == "fast"  # default filled
    for bad, needle in [
        ({}, "'query' is a required property"),
        ({"query": 3}, "query: 3 is not of type 'string'"),
        ({"query": "x", "mode": "slow"}, "mode: 'slow' is not one of"),
        ({"query": "x", "filters": {"year": 1800}}, "filters/year"),
        ({"query": "x", "filters": {"year": 2000, "tags": [1]}}, "filters/tags/0"),
        ({"query": "x", "timeout": 99}, "Additional properties are not allowed"),
        ([1, 2], "must be a JSON object"),
    ]:
        got, err = tools.check_arguments("search", bad)
        assert got is None and needle in err, (bad, err)


@pytest.mark.parametrize(
    "body,needle",
    [
        ("tools: {}", "expected a top-level 'tools:' list"),
        ("tools: [{config: {type: native}, tool_schema: {function: {name: a}}}]", "tools[0].class_name: required"),
        ("tools: [{class_name: nope.Missing, tool_schema: {function: {name: a}}}]", "tools[0].class_name: "),
        (
            "tools: [{class_name: slime.tools.schemas.ToolResponse, tool_schema: {function: {name: a}}}]",
            "not a subclass of slime.tools.BaseTool",
        ),
        (
            "tools: [{class_name: slime.tools.example_tools.CalculatorTool, config: {type: mcp}, "
            "tool_schema: {function: {name: a}}}]",
            "tools[0].config.type: 'mcp' is not supported",
        ),
        ("tools: [{class_name: slime.tools.example_tools.CalculatorTool}]", "tools[0].tool_schema: required"),
        (
            "tools: [{class_name: slime.tools.example_tools.CalculatorTool, tool_schema: {function: {description: x}}}]",
            "tools[0].tool_schema.function.name: Field required",
        ),
        (
            "tools: [{class_name: slime.tools.example_tools.CalculatorTool, tool_schema: {function: {name: a, "
            "parameters: {type: object, properties: {x: {type: 5}}}}}}]",
            "tools[0].tool_schema.function.parameters",
        ),
        (
            "tools: [{class_name: slime.tools.example_tools.CalculatorTool, tool_schema: {function: {name: a}}},"
            " {class_name: slime.tools.gsm8k_tool.Gsm8kTool, tool_schema: {function: {name: a}}}]",
            "tools[1].tool_schema.function.name: duplicate tool name 'a' (already used by tools[0])",
        ),
        (
            "tools: [{class_name: slime.tools.example_tools.CalculatorTool, config: {key: '${SLIME_NOPE_VAR}'}, "
            "tool_schema: {function: {name: a}}}]",
            "tools[0].config.key: environment variable 'SLIME_NOPE_VAR'",
        ),
        (
            "tools: [{class_name: slime.tools.example_tools.CalculatorTool, extra: 1, tool_schema: {function: {name: a}}}]",
            "tools[0]: unknown field(s) ['extra']",
        ),
        ("tools: [", "invalid YAML"),
    ],
)
def test_registry_errors_name_file_entry_field(tmp_path, body, needle):
    path = write(tmp_path, body, "bad.yaml")
    with pytest.raises(ToolConfigError) as e:
        load_tool_config(path)
    assert str(path) in str(e.value) and needle in str(e.value), str(e.value)


def test_env_expansion(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIME_TEST_URL", "http://x")
    path = write(
        tmp_path,
        "tools: [{class_name: slime.tools.example_tools.CalculatorTool, "
        "config: {url: '${SLIME_TEST_URL}/run'}, tool_schema: {function: {name: a}}}]",
    )
    assert load_tool_config(path)["a"].config["url"] == "http://x/run"


# ---- built-in tools -----------------------------------------------------------------------------
async def test_gsm8k_tool_lifecycle():
    tool = load_tool_config(ROOT / "configs" / "gsm8k_tool.yaml")["calc_gsm8k_reward"]
    iid, resp = await tool.create("i1", ground_truth="Natalia sold ... #### 72")
    assert iid == "i1" and resp.text is None
    r, step, _ = await tool.execute(iid, {"answer": "71"})
    assert step == -0.05 and "reward=0.0" in r.text
    r, step, _ = await tool.execute(iid, {"answer": "$72.00"})
    assert step == 0.0 and "reward=1.0" in r.text
    assert await tool.calc_reward(iid) == 1.0
    await tool.release(iid)
    assert iid not in tool._state
    assert extract_number("#### 1,234") == extract_number("1234.0")


async def test_calculator_is_stateless_and_safe():
    tool = load_tool_config(ROOT / "configs" / "example_tool.yaml")["calculator"]
    r, _, m = await tool.execute("any", {"expression": "(3 + 4) * 12"})
    assert r.text == "84" and m == {"ok": 1}
    r, _, m = await tool.execute("any", {"expression": "__import__('os')"})
    assert r.text.startswith("error") and m == {"ok": 0}
    assert (await tool.execute("any", {"expression": "1/0"}))[0].text == "error: division by zero"
    with pytest.raises(ValueError):
        safe_eval("9 ** 9999")


# ---- chat template checks through the multi-turn context ------------------------------------------
def test_non_append_only_template_refused_or_warned(tok, caplog):
    from rollout_plugins.multi_turn import MultiTurnContext

    class Tok:  # a template that numbers messages from the end: every new turn rewrites history
        def __init__(self, inner):
            self.inner = inner
            self.all_special_ids, self.eos_token_id, self.chat_template = inner.all_special_ids, inner.eos_token_id, ""

        def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False, **kw):
            n = len(messages)
            out = "".join(
                f"<|im_start|>{m['role']} {n - i}\n{m['content']}<|im_end|>\n" for i, m in enumerate(messages)
            )
            return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")

        def encode(self, text, add_special_tokens=False):
            return self.inner.encode(text, add_special_tokens=False)

        def decode(self, ids, **kw):
            return self.inner.decode(ids, **kw)

    args = argparse.Namespace(**{**tool_defaults(), "hf_checkpoint": "weird-model"})
    with pytest.raises(TemplateDriftError, match="weird-model.*not append-only.*--chat-template-check warn"):
        MultiTurnContext(args, tokenizer=Tok(tok))
    args.chat_template_check = "warn"
    with caplog.at_level(logging.WARNING):
        ctx = MultiTurnContext(args, tokenizer=Tok(tok))
    assert not ctx.template_report.ok and "not append-only" in caplog.text
    args.chat_template_check = "off"
    assert MultiTurnContext(args, tokenizer=Tok(tok)).template_report is None


def test_tool_flags():
    p = add_tool_arguments(argparse.ArgumentParser())
    a = p.parse_args(
        [
            "--tool-config-path",
            "x.yaml",
            "--max-turns",
            "3",
            "--tool-reward-mode",
            "add",
            "--tool-response-truncate-side",
            "left",
            "--max-tokens-per-turn",
            "64",
        ]
    )
    assert (a.tool_config_path, a.max_turns, a.tool_reward_mode, a.max_tokens_per_turn) == ("x.yaml", 3, "add", 64)
    d = tool_defaults()
    assert d["tool_call_parser"] == "hermes" and d["chat_template_check"] == "error"
    assert ToolSet([]).names == []


class _SyncClosingTool(CalculatorTool):
    """A tool whose optional `close()` is a plain function: it must be called too."""

    closed = 0

    def close(self) -> None:
        type(self).closed += 1


def test_the_runtime_owns_its_tool_sets_and_closes_each_tools_session(tmp_path):
    """`get_tool_set` (a slime-style plugin's view) is the bound runtime's `tool_sets`; `close_tool_sets`
    closes them (sync and async `close()`) and forgets them; the runtime closes what it holds when it
    closes; with no runtime bound there is nothing to close and nothing to load into."""
    import asyncio

    import yaml

    from slime.rollout.runtime import bound, close_tool_sets, unbind
    from slime.testing.runtime import bind_runtime

    cfg = yaml.safe_load(
        native_tools_yaml(
            (
                f"{__name__}._SyncClosingTool",
                "calc",
                "math",
                {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
            )
        )
    )
    cfg["tools"].append(
        {
            "class_name": "slime.tools.sandbox_fusion_tool.SandboxFusionTool",
            "config": {"type": "native", "sandbox_fusion_url": "http://127.0.0.1:9", "enable_global_rate_limit": False},
            "tool_schema": {
                "type": "function",
                "function": {
                    "name": "code_interpreter",
                    "description": "run code",
                    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
                },
            },
        }
    )
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump(cfg))

    async def scenario():
        runtime = bind_runtime(argparse.Namespace(sglang_server_concurrency=1))
        tools = get_tool_set(path)
        assert tools is runtime.tool_sets.get(str(path))
        session = tools["code_interpreter"]._http.session()  # noqa: SLF001 - the resource under test
        assert not session.closed
        await close_tool_sets()
        assert session.closed and _SyncClosingTool.closed == 1
        again = get_tool_set(path)
        assert again is not tools  # forgotten: the next user builds a fresh set
        session = again["code_interpreter"]._http.session()  # noqa: SLF001
        unbind(runtime)  # owned by the binding: closed, on this loop
        await runtime.closing
        assert session.closed and _SyncClosingTool.closed == 2 and bound() is None
        await close_tool_sets()  # nothing bound: nothing to close
        with pytest.raises(RuntimeError, match="no rollout runtime in this process"):
            get_tool_set(path)

    _SyncClosingTool.closed = 0
    asyncio.run(scenario())
