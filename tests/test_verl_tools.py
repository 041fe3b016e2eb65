"""verl compatibility of the tool system: verl's tool YAMLs unchanged, tool classes written against
verl's BaseTool (every calling convention and return shape), the search tool against a local
retriever, and per-sample tools reaching the chat template."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import textwrap
from pathlib import Path
from typing import Any, Optional
from uuid import uuid4

import pytest

# Written as a verl user writes a tool, with only `verl.tools` changed to `slime.tools`:
from slime.tools.base_tool import BaseTool
from slime.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from slime.tools.gsm8k_tool import Gsm8kTool
from slime.tools.registry import ToolConfigError, ToolSet, load_tool_config, sample_tool_schemas
from slime.tools.sandbox_fusion_tool import SandboxFusionTool
from slime.tools.search_tool import SearchTool
from slime.tools.verl_compat import VERL_EQUIVALENTS, AgentDataView, VerlToolAdapter, verl_installed

ROOT = Path(__file__).resolve().parents[1]
VERL = ROOT / "configs" / "verl"
without_verl = pytest.mark.skipif(verl_installed(), reason="checks the mapping used when verl is not installed")


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

    async def execute(self, instance_id: str, parameters: dict[str, Any], agent_data=None,
                      **kwargs) -> tuple[ToolResponse, float, dict]:
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
    body = {"tools": [{"class_name": f"{__name__}.{cls}", "config": {"type": "native"},
                       "tool_schema": {"type": "function", "function": {
                           "name": tool, "description": f"{tool} tool",
                           "parameters": {"type": "object", "properties": props}}}}
                      for cls, tool, props in entries]}
    p = tmp_path / name
    p.write_text(json.dumps(body))  # JSON is YAML
    return p


@pytest.fixture()
def verl_style(tmp_path) -> ToolSet:
    return load_tool_config(tool_yaml(tmp_path, [
        ("CounterTool", "counter", {"step": {"type": "integer"}}),
        ("OldEchoTool", "echo", {"text": {"type": "string"}}),
        ("ExplicitKwargsTool", "explicit", {}),
    ]))


# ---- verl's YAMLs, unchanged ----------------------------------------------------------------------
@without_verl
@pytest.mark.parametrize("config,names,cls", [
    ("gsm8k_tool_config.yaml", ["calc_gsm8k_reward"], Gsm8kTool),
    ("sandbox_fusion_tool_config.yaml", ["code_interpreter"], SandboxFusionTool),
    ("search_tool_config.yaml", ["search"], SearchTool),
])
def test_verl_yaml_loads_unchanged(config, names, cls, caplog):
    with caplog.at_level(logging.INFO, logger="slime.tools.registry"):
        tools = load_tool_config(VERL / config)
    assert tools.names == names and type(tools[names[0]]) is cls
    notes = [r.getMessage() for r in caplog.records if r.name == "slime.tools.registry"]
    verl_name = {Gsm8kTool: "verl.tools.gsm8k_tool.Gsm8kTool", SearchTool: "verl.tools.search_tool.SearchTool",
                 SandboxFusionTool: "verl.tools.sandbox_fusion_tools.SandboxFusionTool"}[cls]
    assert notes == [f"{VERL / config}: tools[0]: {verl_name} -> {cls.__module__}.{cls.__name__} "
                     f"(verl is not installed; slime's equivalent)"]


@without_verl
def test_verl_search_yaml_keeps_its_schema_and_config():
    tool = load_tool_config(VERL / "search_tool_config.yaml")["search"]
    assert (tool.retrieval_service_url, tool.topk, tool.timeout, tool.num_workers) == (
        "http://127.0.0.1:8000/retrieve", 3, 30.0, 120)
    prop = tool.tool_schema.to_openai()["function"]["parameters"]["properties"]["query_list"]
    assert prop["type"] == "array" and prop["item"] == {"type": "string"}  # verl's spelling kept as is


@without_verl
async def test_verl_gsm8k_yaml_runs_with_both_create_conventions():
    tool = load_tool_config(VERL / "gsm8k_tool_config.yaml")["calc_gsm8k_reward"]
    iid, _ = await tool.create(create_kwargs={"ground_truth": "#### 72"})  # verl's agent loop
    resp, step, _ = await tool.execute(iid, {"answer": "72"})
    assert (resp.text, step, await tool.calc_reward(iid)) == ("Current parsed answer='72' reward=1.0", 0.0, 1.0)
    await tool.release(iid)
    iid, _ = await tool.create("x", ground_truth="#### 72")  # the older convention
    assert iid == "x" and (await tool.execute(iid, {"answer": "70"}))[1] == -0.05
    await tool.release(iid)


@without_verl
def test_verl_mcp_yaml_is_accepted_and_names_what_is_missing(monkeypatch):
    from slime.tools import mcp_tool

    monkeypatch.setattr(mcp_tool, "mcp_client_available", lambda: False)
    with pytest.raises(ToolConfigError) as e:
        load_tool_config(VERL / "mcp_tool_config.yaml")
    msg = str(e.value)
    assert "unknown field" not in msg
    assert msg == (f"{VERL / 'mcp_tool_config.yaml'}: tools[0] (verl.tools.mcp_search_tool.MCPSearchTool, "
                   f"config.type: mcp): cannot create the MCP tools ['web_search'] of "
                   f"{VERL / 'mcp_server.json'}: the MCP client "
                   f"library is not installed (pip install mcp)")


@pytest.mark.parametrize("mcp,needle", [
    ({}, "tools[0].mcp.mcp_servers_config_path: required"),
    ({"mcp_servers_config_path": "nope.json"}, "tools[0].mcp.mcp_servers_config_path: no such file 'nope.json'"),
    ({"mcp_servers_config_path": "servers.json", "extra": 1}, "tools[0].mcp: unknown field(s) ['extra']"),
    ({"mcp_servers_config_path": "servers.json", "tool_selected_list": "a"},
     "tools[0].mcp.tool_selected_list: expected a list"),
    ({"mcp_servers_config_path": "empty.json"}, "empty.json: expected {\"mcpServers\""),
    ({"mcp_servers_config_path": "bad_server.json"}, "server 's' needs a \"url\" or a \"command\""),
])
def test_mcp_entry_errors(tmp_path, mcp, needle):
    (tmp_path / "servers.json").write_text('{"mcpServers": {"s": {"command": "x"}}}')
    (tmp_path / "empty.json").write_text('{"mcpServers": {}}')
    (tmp_path / "bad_server.json").write_text('{"mcpServers": {"s": {"port": 1}}}')
    p = tmp_path / "mcp.yaml"
    p.write_text(json.dumps({"tools": [{"class_name": "slime.tools.mcp_tool.MCPTool",
                                        "config": {"type": "mcp"}, "mcp": mcp}]}))
    with pytest.raises(ToolConfigError) as e:
        load_tool_config(p)
    assert needle in str(e.value), str(e.value)


def test_mcp_section_needs_type_mcp_and_no_schema(tmp_path):
    (tmp_path / "s.json").write_text('{"mcpServers": {"s": {"url": "http://127.0.0.1:1/mcp"}}}')
    p = tmp_path / "t.yaml"
    p.write_text(json.dumps({"tools": [{"class_name": "slime.tools.mcp_tool.MCPTool", "config": {"type": "native"},
                                        "mcp": {"mcp_servers_config_path": "s.json"}}]}))
    with pytest.raises(ToolConfigError, match=r"tools\[0\]\.mcp: only used with config\.type: mcp"):
        load_tool_config(p)
    p.write_text(json.dumps({"tools": [{"class_name": "slime.tools.mcp_tool.MCPTool", "config": {"type": "mcp"},
                                        "mcp": {"mcp_servers_config_path": "s.json"},
                                        "tool_schema": {"function": {"name": "a"}}}]}))
    with pytest.raises(ToolConfigError, match=r"tools\[0\]\.tool_schema: not used with config\.type: mcp"):
        load_tool_config(p)


@without_verl
def test_unmapped_verl_class_is_an_error_naming_the_mapped_ones(tmp_path):
    p = tmp_path / "zoom.yaml"
    p.write_text(json.dumps({"tools": [{"class_name": "verl.tools.image_zoom_in_tool.ImageZoomInTool",
                                        "config": {"type": "native"}, "tool_schema": {"function": {"name": "g"}}}]}))
    with pytest.raises(ToolConfigError) as e:
        load_tool_config(p)
    assert "tools[0].class_name: 'verl.tools.image_zoom_in_tool.ImageZoomInTool': verl is not installed and slime " \
           "has no equivalent" in str(e.value)
    assert str(e.value).endswith("point class_name at your own tool class (tool 'g')")
    assert all(name in str(e.value) for name in VERL_EQUIVALENTS)


def test_installed_verl_class_is_used_and_adapted(tmp_path, monkeypatch, caplog):
    """A stand-in `verl` package on sys.path: the YAML's class is verl's own, run through the adapter
    with verl's (stricter) schema model, and the log says so."""
    pkg = tmp_path / "fakeverl" / "verl" / "tools"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "schemas.py").write_text(textwrap.dedent("""
        from pydantic import BaseModel
        class OpenAIFunctionPropertySchema(BaseModel):
            type: str
            description: str | None = None
        class OpenAIFunctionParametersSchema(BaseModel):
            type: str
            properties: dict[str, OpenAIFunctionPropertySchema]
            required: list[str]
        class OpenAIFunctionSchema(BaseModel):
            name: str
            description: str
            parameters: OpenAIFunctionParametersSchema
        class OpenAIFunctionToolSchema(BaseModel):
            type: str
            function: OpenAIFunctionSchema
        class ToolResponse(BaseModel):
            text: str | None = None
            image: list | None = None
            video: list | None = None
    """))
    (pkg / "gsm8k_tool.py").write_text(textwrap.dedent("""
        from .schemas import OpenAIFunctionToolSchema, ToolResponse
        class Gsm8kTool:
            def __init__(self, config, tool_schema: OpenAIFunctionToolSchema):
                assert isinstance(tool_schema, OpenAIFunctionToolSchema), type(tool_schema)
                self.config, self.tool_schema, self.name = config, tool_schema, tool_schema.function.name
                self.gt = {}
            async def create(self, instance_id=None, ground_truth=None, **kwargs):
                self.gt[instance_id] = ground_truth or kwargs.get("create_kwargs", {}).get("ground_truth")
                return instance_id, ToolResponse()
            async def execute(self, instance_id, parameters, **kwargs):
                ok = parameters.get("answer") == self.gt[instance_id]
                return ToolResponse(text=f"verl says {ok}"), 0.0, {}
            async def calc_reward(self, instance_id, **kwargs):
                return 1.0
            async def release(self, instance_id, **kwargs):
                del self.gt[instance_id]
    """))
    monkeypatch.syspath_prepend(str(tmp_path / "fakeverl"))
    try:
        with caplog.at_level(logging.INFO, logger="slime.tools.registry"):
            tool = load_tool_config(VERL / "gsm8k_tool_config.yaml")["calc_gsm8k_reward"]
        assert isinstance(tool, VerlToolAdapter) and type(tool.inner).__module__ == "verl.tools.gsm8k_tool"
        assert type(tool.inner.tool_schema).__module__ == "verl.tools.schemas"
        assert "verl.tools.gsm8k_tool.Gsm8kTool: verl's own class (verl is installed)" in caplog.text
    finally:
        for mod in [m for m in sys.modules if m == "verl" or m.startswith("verl.")]:
            del sys.modules[mod]


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
        adapter = VerlToolAdapter.build(Strict, {}, OpenAIFunctionToolSchema.model_validate(
            {"function": {"name": "s"}}))
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
    p.write_text(json.dumps({"tools": [{"class_name": "slime.tools.schemas.ToolResponse",
                                        "tool_schema": {"function": {"name": "a"}}}]}))
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
    path = tool_yaml(tmp_path, [("CounterTool", "counter", {"step": {"type": "integer"}}),
                                ("OldEchoTool", "echo", {"text": {"type": "string"}})], "loop.yaml")
    args = argparse.Namespace(**{**tool_defaults(), "tool_config_path": str(path), "rollout_max_response_len": 64})
    ctx = MultiTurnContext(args, tokenizer=tok)
    sample = Sample(index=3, prompt=[{"role": "user", "content": "count"}],
                    metadata={"tools_kwargs": {"counter": {"create_kwargs": {"start": 10}},
                                               "echo": {"create_kwargs": {"prefix": "> "}}}})
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


# ---- search against a local retriever -------------------------------------------------------------
CORPUS = ["Paris\nParis is the capital of France.", "Berlin\nBerlin is the capital of Germany.",
          "Rome\nRome is the capital of Italy and was founded long ago."]


@pytest.fixture()
def retriever():
    from slime.testing.retriever import Retriever

    with Retriever(CORPUS) as r:
        yield r


def search_tool(tmp_path: Path, url: str, **extra: Any) -> SearchTool:
    """verl's search YAML with only the URL (and extra config) changed."""
    import yaml

    data = yaml.safe_load((VERL / "search_tool_config.yaml").read_text())
    data["tools"][0]["config"].update(retrieval_service_url=url, **extra)
    data["tools"][0]["class_name"] = "slime.tools.search_tool.SearchTool"
    p = tmp_path / "search.yaml"
    p.write_text(yaml.safe_dump(data))
    return load_tool_config(p)["search"]


async def test_search_tool_against_local_retriever(tmp_path, retriever):
    tool = search_tool(tmp_path, retriever.url, topk=2)
    iid, _ = await tool.create()
    resp, reward, metrics = await tool.execute(iid, {"query_list": ["capital of Germany", "Italy founded"]})
    assert retriever.requests == [{"queries": ["capital of Germany", "Italy founded"], "topk": 2,
                                   "return_scores": True}]
    expected = ("Doc 1 (Title: Berlin)\nBerlin is the capital of Germany.\n\n"
                "Doc 2 (Title: Paris)\nParis is the capital of France.\n---\n"
                "Doc 1 (Title: Rome)\nRome is the capital of Italy and was founded long ago.\n\n"
                "Doc 2 (Title: Paris)\nParis is the capital of France.")
    assert resp.text == json.dumps({"result": expected}) and reward == 0.0
    assert metrics == {"query_count": 2, "status": "success", "total_results": 4, "api_request_error": None}
    assert tool.results(iid) == [resp.text] and await tool.calc_reward(iid) == 0.0
    await tool.release(iid)
    assert tool.results(iid) == []


async def test_search_tool_retries_then_reports(tmp_path, retriever):
    tool = search_tool(tmp_path, retriever.url, max_retries=2, retry_base_delay=0.01)
    retriever.fail_next(2, 503)
    resp, _, metrics = await tool.execute("none", {"query_list": ["Paris"]})
    assert metrics["status"] == "success" and len(retriever.requests) == 3
    assert json.loads(resp.text)["result"].startswith("Doc 1 (Title: Paris)")
    retriever.fail_next(3, 502)
    resp, _, metrics = await tool.execute("none", {"query_list": ["Paris"]})
    assert metrics["status"] == "api_error" and len(retriever.requests) == 6
    assert resp.text == json.dumps({"result": "Search error: server error (HTTP 502) after 3 attempt(s)"})
    retriever.fail_next(1, 400)  # a client error is not retried
    _, _, metrics = await tool.execute("none", {"query_list": ["Paris"]})
    assert metrics["status"] == "api_error" and "HTTP 400" in metrics["api_request_error"]
    assert len(retriever.requests) == 7


async def test_search_tool_bad_arguments_and_no_server(tmp_path):
    from slime.utils.misc import find_free_port

    tool = search_tool(tmp_path, f"http://127.0.0.1:{find_free_port()}/retrieve", max_retries=1,
                       retry_base_delay=0.01)
    resp, _, metrics = await tool.execute("i", {"query_list": []})
    assert json.loads(resp.text) == {"result": "Error: 'query_list' is missing, empty, or not a list in parameters."}
    resp, _, metrics = await tool.execute("i", {"query_list": ["x"]})
    assert metrics["status"] == "api_error" and "connection error" in metrics["api_request_error"]
    assert "after 2 attempt(s)" in json.loads(resp.text)["result"]


def test_search_tool_needs_a_url(tmp_path):
    with pytest.raises(ToolConfigError, match="config.retrieval_service_url is required"):
        search_tool(tmp_path, "")


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


@pytest.mark.parametrize("tools,kwargs,needle", [
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
])
def test_sample_tools_errors(verl_style, tools, kwargs, needle):
    with pytest.raises(ValueError) as e:
        verl_style.select(tools, kwargs)
    assert needle in str(e.value), str(e.value)


def test_sample_schemas_reach_the_chat_template(verl_style):
    from transformers import AutoTokenizer

    from slime.testing.tiny_model import qwen_tokenizer_dir
    from slime.tools.chat_format import ChatDelta

    tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    schemas = verl_style.schemas_for([{"name": "echo", "description": "say it back",
                                       "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}])
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
