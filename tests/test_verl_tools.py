"""verl compatibility of the tool system, tool classes: classes written against verl's BaseTool (every
calling convention and return shape) run through the registry's adapter and the multi-turn loop, and
per-sample tools (`--tool-key`) reaching the chat template. Loading verl's YAMLs: test_verl_tool_loading.py;
the search tool: test_verl_search_tool.py."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any, Optional
from uuid import uuid4

import pytest

# Written as a verl user writes a tool, with only `verl.tools` changed to `slime.tools`:
from slime.tools.base_tool import BaseTool
from slime.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from slime.tools.registry import ToolConfigError, ToolSet, load_tool_config, sample_tool_schemas
from slime.tools.verl_compat import AgentDataView, VerlToolAdapter


# ---- tools in verl's style ------------------------------------------------------------------------
class CounterTool(BaseTool):
    """verl >= 0.5 style: reads `create_kwargs`, takes `agent_data`, returns ToolResponse tuples."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)
        self._instance_dict = {}

    async def create(self, instance_id: Optional[str] = None, **kwargs) -> tuple[str, ToolResponse]:
        if instance_id is None:
            instance_id = str(uuid4())
        start = kwargs.get("create_kwargs", {}).get("start", 0)
        self._instance_dict[instance_id] = {"count": start}
        return instance_id, ToolResponse(text=f"counter at {start}")

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], agent_data=None, **kwargs
    ) -> tuple[ToolResponse, float, dict]:
        state = self._instance_dict[instance_id]
        state["count"] += int(parameters.get("step", 1))
        calls = agent_data.extra_fields["calls"] = agent_data.extra_fields.get("calls", 0) + 1
        return ToolResponse(text=f"{state['count']} (call {calls} of {agent_data.request_id})"), 0.1, {"n": calls}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return self._instance_dict[instance_id]["count"] / 10

    async def release(self, instance_id: str, **kwargs) -> None:
        del self._instance_dict[instance_id]


class OldEchoTool:
    """verl < 0.4 style, not even a BaseTool subclass: create returns the id alone, execute returns
    (text, reward, metrics) with plain text, calc_reward is synchronous and returns an int."""

    def __init__(self, config, tool_schema):
        self.config, self.tool_schema, self.name = config, tool_schema, tool_schema.function.name
        self.prefix: dict[str, str] = {}

    async def create(self, instance_id=None, prefix="", **kwargs):
        self.prefix[instance_id] = prefix
        return instance_id

    async def execute(self, instance_id, parameters, **kwargs):
        return f"{self.prefix[instance_id]}{parameters['text']}", 1.0, {"len": len(parameters["text"])}

    def calc_reward(self, instance_id, **kwargs):
        return len(self.prefix[instance_id])

    async def release(self, instance_id, **kwargs):
        del self.prefix[instance_id]


class ExplicitKwargsTool(BaseTool):
    """Names `create_kwargs` and returns a bare ToolResponse from execute."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)
        self.seen = {}

    async def create(self, instance_id: Optional[str] = None, create_kwargs: Optional[dict] = None):
        self.seen[instance_id] = create_kwargs
        return instance_id, ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=json.dumps(self.seen[instance_id], sort_keys=True))

    async def calc_reward(self, instance_id, **kwargs):
        return [1, 2]  # verl's search tool returns its results here: not a reward

    async def release(self, instance_id, **kwargs):
        self.seen.pop(instance_id)


def tool_yaml(tmp_path: Path, entries: list[tuple[str, str, dict]], name: str = "tools.yaml") -> Path:
    """(class, tool name, properties) -> a verl tool YAML."""
    body = {
        "tools": [
            {
                "class_name": f"{__name__}.{cls}",
                "config": {"type": "native"},
                "tool_schema": {
                    "type": "function",
                    "function": {
                        "name": tool,
                        "description": f"{tool} tool",
                        "parameters": {"type": "object", "properties": props},
                    },
                },
            }
            for cls, tool, props in entries
        ]
    }
    p = tmp_path / name
    p.write_text(json.dumps(body))  # JSON is YAML
    return p


@pytest.fixture()
def verl_style(tmp_path) -> ToolSet:
    return load_tool_config(
        tool_yaml(
            tmp_path,
            [
                ("CounterTool", "counter", {"step": {"type": "integer"}}),
                ("OldEchoTool", "echo", {"text": {"type": "string"}}),
                ("ExplicitKwargsTool", "explicit", {}),
            ],
        )
    )


# ---- tool classes in verl's style through the registry adapter ------------------------------------
async def test_verl_style_tool_new_convention(verl_style):
    tool = verl_style["counter"]
    assert isinstance(tool, VerlToolAdapter) and isinstance(tool.inner, CounterTool)
    iid, resp = await tool.create(create_kwargs={"start": 3})  # verl's agent loop: no id, create_kwargs=
    assert resp.text == "counter at 3" and iid in tool._instance_dict  # attributes read through
    assert await tool.execute(iid, {"step": 2}) == (ToolResponse(text=f"5 (call 1 of {iid})"), 0.1, {"n": 1})
    # the stand-in agent_data lives as long as the instance: session data carries over
    assert (await tool.execute(iid, {"step": 1}))[0].text == f"6 (call 2 of {iid})"
    mine = AgentDataView("req-7")  # the caller's own agent_data is passed on as is
    assert (await tool.execute(iid, {}, agent_data=mine))[0].text == "7 (call 1 of req-7)"
    assert await tool.calc_reward(iid) == 0.7
    await tool.release(iid)
    assert tool._instance_dict == {} and tool._agent_data == {}


async def test_verl_style_tool_old_convention(verl_style):
    tool = verl_style["counter"]
    iid, _ = await tool.create("i1", start=4)  # slime's loop / verl's older loop: flattened kwargs
    assert iid == "i1" and tool._instance_dict["i1"] == {"count": 4}
    await tool.release(iid)


@pytest.mark.parametrize("convention", ["flat", "create_kwargs"])
async def test_old_tuple_tool(verl_style, convention):
    tool = verl_style["echo"]
    kw = {"prefix": ">> "}
    iid, resp = await (tool.create("e1", **kw) if convention == "flat" else tool.create("e1", create_kwargs=kw))
    assert iid == "e1" and resp == ToolResponse()  # a bare id returned
    assert await tool.execute(iid, {"text": "hi"}) == (ToolResponse(text=">> hi"), 1.0, {"len": 2})
    assert await tool.calc_reward(iid) == 3.0  # a sync method returning an int
    await tool.release(iid)
    assert tool.prefix == {}


async def test_explicit_create_kwargs_and_bare_response(verl_style, caplog):
    tool = verl_style["explicit"]
    iid, _ = await tool.create("x", a=1)
    assert await tool.execute(iid, {}) == (ToolResponse(text='{"a": 1}'), 0.0, {})
    with caplog.at_level(logging.WARNING, logger="slime.tools.verl_compat"):
        assert await tool.calc_reward(iid) == 0.0 and await tool.calc_reward(iid) == 0.0
    assert caplog.text.count("calc_reward() returned list, not a number; counted as 0.0") == 1
    await tool.release(iid)
    with pytest.raises(TypeError, match=r"OldEchoTool.create\(\) does not accept"):
        # no **kwargs and no create_kwargs parameter: unknown kwargs are refused, not dropped
        class Strict(OldEchoTool):
            async def create(self, instance_id=None, prefix=""):
                return instance_id

        Strict.__name__ = "OldEchoTool"
        adapter = VerlToolAdapter.build(
            Strict, {}, OpenAIFunctionToolSchema.model_validate({"function": {"name": "s"}})
        )
        await adapter.create("y", colour="red")


async def test_bad_execute_result_is_an_error(tmp_path):
    class Weird(OldEchoTool):
        async def execute(self, instance_id, parameters, **kwargs):
            return ("a", 1, {}, "extra")

    adapter = VerlToolAdapter.build(Weird, {}, OpenAIFunctionToolSchema.model_validate({"function": {"name": "w"}}))
    with pytest.raises(TypeError, match=r"tool 'w': execute\(\) returned a 4-tuple"):
        await adapter.execute("i", {})


def test_non_tool_class_is_refused(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text(
        json.dumps(
            {"tools": [{"class_name": "slime.tools.schemas.ToolResponse", "tool_schema": {"function": {"name": "a"}}}]}
        )
    )
    with pytest.raises(ToolConfigError, match="not a subclass of slime.tools.BaseTool nor a verl-style tool class"):
        load_tool_config(p)


def test_tool_response_contract():
    assert ToolResponse().is_empty() and ToolResponse(text="a").is_text_only()
    assert not ToolResponse(text="a", image=[1]).is_text_only()
    with pytest.raises(ValueError, match="image must be a list"):
        ToolResponse(image="img.png")


async def test_verl_style_tools_in_the_multi_turn_loop(tmp_path):
    """The loop's own calls (create/execute/calc_reward/release with per-sample tools_kwargs) on adapters."""
    from transformers import AutoTokenizer

    from rollout_plugins.multi_turn import MultiTurnContext, Trajectory
    from slime.testing.tiny_model import qwen_tokenizer_dir
    from slime.tools.flags import tool_defaults
    from slime.tools.chat_format import ToolCall
    from slime.utils.types import Sample

    tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    path = tool_yaml(
        tmp_path,
        [
            ("CounterTool", "counter", {"step": {"type": "integer"}}),
            ("OldEchoTool", "echo", {"text": {"type": "string"}}),
        ],
        "loop.yaml",
    )
    args = argparse.Namespace(**{**tool_defaults(), "tool_config_path": str(path), "rollout_max_response_len": 64})
    ctx = MultiTurnContext(args, tokenizer=tok)
    sample = Sample(
        index=3,
        prompt=[{"role": "user", "content": "count"}],
        metadata={
            "tools_kwargs": {"counter": {"create_kwargs": {"start": 10}}, "echo": {"create_kwargs": {"prefix": "> "}}}
        },
    )
    traj = Trajectory(ctx, args, sample, {"max_new_tokens": 16})
    names = traj.active_tools()
    traj.build_prompt(names)
    await traj.create_tools(names)
    msgs = await traj.run_calls([ToolCall("counter", {"step": 5}, "", 0), ToolCall("echo", {"text": "x"}, "", 1)], 1)
    iid = traj.instances["counter"]
    assert [m["content"] for m in msgs] == [f"15 (call 1 of {iid})", "> x"]
    await traj.final_rewards()
    await traj.release_tools()
    md = traj.fill_sample().metadata
    assert md["tool_rewards"] == {"counter": 1.5, "echo": 2.0} and md["tool_reward_total"] == pytest.approx(4.6)
    assert md["tool_errors"] == [] and md["tool_create_responses"] == {"counter": "counter at 10"}
    assert ctx.tools["counter"]._instance_dict == {} and ctx.tools["echo"].prefix == {}


# ---- per-sample tools (--tool-key) ----------------------------------------------------------------
def test_sample_tools_select_and_schemas(tmp_path, verl_style):
    ts = verl_style
    all_schemas = ts.schemas()
    # nothing per sample: every configured tool
    assert ts.select(None).names == ["counter", "echo", "explicit"] and ts.schemas_for(None) == all_schemas
    # verl's tools_kwargs (None entries are Parquet's absent tools)
    sel = ts.select({"echo": {"create_kwargs": {"prefix": "p"}}, "counter": None})
    assert (sel.names, sel.kwargs) == (["echo"], {"echo": {"create_kwargs": {"prefix": "p"}}})
    assert sel.schemas == [all_schemas[1]]
    # slime's list of OpenAI schemas (as given: the sample's description is what the model sees),
    # bare function dicts, names, and the same as a JSON string
    params = {"type": "object", "properties": {"text": {"type": "string"}}}
    own = {"type": "function", "function": {"name": "echo", "description": "say it back", "parameters": params}}
    given = [own, {"name": "counter", "description": "count"}, "explicit"]
    for tools in (given, json.dumps(given)):
        sel = ts.select(tools, {"echo": {"create_kwargs": {"prefix": "q"}}})
        assert sel.names == ["echo", "counter", "explicit"]
        assert sel.kwargs == {"echo": {"create_kwargs": {"prefix": "q"}}}
        assert sel.schemas[0]["function"]["description"] == "say it back"
        assert sel.schemas[1]["function"]["description"] == "count"
        assert sel.schemas[2] == all_schemas[2]
    assert sample_tool_schemas([own]) == [OpenAIFunctionToolSchema.model_validate(own).to_openai()]


@pytest.mark.parametrize(
    "tools,kwargs,needle",
    [
        ({"nope": {}}, None, "tools_kwargs names tool(s) ['nope'] that are not in the tool config"),
        ([{"name": "web"}], None, "the sample's tools ['web'] are not in the tool config"),
        (["echo"], {"counter": {}}, "tools_kwargs names tool(s) ['counter'] that the sample's tools ['echo'] do not"),
        (["nope"], None, "the sample's tools[0]: no tool named 'nope'"),
        ([{"function": {"description": "x"}}], None, "the sample's tools[0].function.name: Field required"),
        (["echo", {"name": "echo"}], None, "the sample's tools[1]: duplicate tool name 'echo'"),
        ("not json", None, "the sample's tools are a string but not JSON"),
        ([3], None, "the sample's tools[0]: expected an OpenAI tool schema (a mapping) or a tool name, got int"),
        (5, None, "must be a list of tool schemas, got int"),
        (None, 5, "tools_kwargs must be a mapping"),
        (None, ["x"], "the sample's tools[0]: no tool named 'x'"),  # slime's list stored under tools_kwargs
    ],
)
def test_sample_tools_errors(verl_style, tools, kwargs, needle):
    with pytest.raises(ValueError) as e:
        verl_style.select(tools, kwargs)
    assert needle in str(e.value), str(e.value)


def test_sample_schemas_reach_the_chat_template(verl_style):
    from transformers import AutoTokenizer

    from slime.testing.tiny_model import qwen_tokenizer_dir
    from slime.tools.chat_format import ChatDelta

    tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    schemas = verl_style.schemas_for(
        [
            {
                "name": "echo",
                "description": "say it back",
                "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
            }
        ]
    )
    text = tok.decode(ChatDelta(tok).prompt_ids([{"role": "user", "content": "hi"}], schemas))
    assert '"name": "echo"' in text and '"description": "say it back"' in text and '"counter"' not in text


async def test_agent_data_only_when_named_or_given():
    class Recorder(OldEchoTool):
        async def execute(self, instance_id, parameters, **kwargs):
            return ToolResponse(text=",".join(sorted(kwargs))), 0.0, {}

    adapter = VerlToolAdapter.build(Recorder, {}, OpenAIFunctionToolSchema.model_validate({"function": {"name": "r"}}))
    iid, _ = await adapter.create("r1")
    assert (await adapter.execute(iid, {}, k=1))[0].text == "k"  # slime's loop gives none: none is invented
    assert (await adapter.execute(iid, {}, agent_data=AgentDataView("q")))[0].text == "agent_data"
    await adapter.release(iid)
