"""verl compatibility of the tool system, loading: verl's tool YAMLs unchanged (slime's equivalent
classes when verl is not installed, verl's own classes through the adapter when it is), MCP entries, and
the errors for what cannot be mapped."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from pathlib import Path

import pytest

from slime.tools.verl_answer_tools import VerlGsm8kTool
from slime.tools.registry import ToolConfigError, load_tool_config
from slime.tools.sandbox_fusion_tool import SandboxFusionTool
from slime.tools.search_tool import SearchTool
from slime.tools.verl_compat import VERL_EQUIVALENTS, VerlToolAdapter, verl_installed

ROOT = Path(__file__).resolve().parents[1]
VERL = ROOT / "configs" / "verl"
without_verl = pytest.mark.skipif(verl_installed(), reason="checks the mapping used when verl is not installed")


# ---- verl's YAMLs, unchanged ----------------------------------------------------------------------
@without_verl
@pytest.mark.parametrize(
    "config,names,cls",
    [
        ("gsm8k_tool_config.yaml", ["calc_gsm8k_reward"], VerlGsm8kTool),
        ("sandbox_fusion_tool_config.yaml", ["code_interpreter"], SandboxFusionTool),
        ("search_tool_config.yaml", ["search"], SearchTool),
    ],
)
def test_verl_yaml_loads_unchanged(config, names, cls, caplog):
    with caplog.at_level(logging.INFO, logger="slime.tools.registry"):
        tools = load_tool_config(VERL / config)
    assert tools.names == names and type(tools[names[0]]) is cls
    notes = [r.getMessage() for r in caplog.records if r.name == "slime.tools.registry"]
    verl_name = {
        VerlGsm8kTool: "verl.tools.gsm8k_tool.Gsm8kTool",
        SearchTool: "verl.tools.search_tool.SearchTool",
        SandboxFusionTool: "verl.tools.sandbox_fusion_tools.SandboxFusionTool",
    }[cls]
    assert notes == [
        f"{VERL / config}: tools[0]: {verl_name} -> {cls.__module__}.{cls.__name__} "
        f"(verl is not installed; slime's equivalent)"
    ]


@without_verl
def test_verl_search_yaml_keeps_its_schema_and_config():
    tool = load_tool_config(VERL / "search_tool_config.yaml")["search"]
    assert (tool.retrieval_service_url, tool.topk, tool.timeout, tool.num_workers) == (
        "http://127.0.0.1:8000/retrieve",
        3,
        30.0,
        120,
    )
    prop = tool.tool_schema.to_openai()["function"]["parameters"]["properties"]["query_list"]
    assert prop["type"] == "array" and prop["item"] == {"type": "string"}  # verl's spelling kept as is


@without_verl
async def test_verl_gsm8k_yaml_runs_with_both_create_conventions():
    tool = load_tool_config(VERL / "gsm8k_tool_config.yaml")["calc_gsm8k_reward"]
    iid, _ = await tool.create(create_kwargs={"ground_truth": "72"})  # verl's agent loop, verl's data recipe
    resp, step, _ = await tool.execute(iid, {"answer": "72"})
    assert (resp.text, step, await tool.calc_reward(iid)) == ("Current parsed answer='72' reward=1.0", 0.0, 1.0)
    await tool.release(iid)
    iid, _ = await tool.create("x", ground_truth="72")  # the older convention
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
    assert msg == (
        f"{VERL / 'mcp_tool_config.yaml'}: tools[0] (verl.tools.mcp_search_tool.MCPSearchTool, "
        f"config.type: mcp): cannot create the MCP tools ['web_search'] of "
        f"{VERL / 'mcp_server.json'}: the MCP client "
        f"library is not installed (pip install mcp)"
    )


@pytest.mark.parametrize(
    "mcp,needle",
    [
        ({}, "tools[0].mcp.mcp_servers_config_path: required"),
        ({"mcp_servers_config_path": "nope.json"}, "tools[0].mcp.mcp_servers_config_path: no such file 'nope.json'"),
        ({"mcp_servers_config_path": "servers.json", "extra": 1}, "tools[0].mcp: unknown field(s) ['extra']"),
        (
            {"mcp_servers_config_path": "servers.json", "tool_selected_list": "a"},
            "tools[0].mcp.tool_selected_list: expected a list",
        ),
        ({"mcp_servers_config_path": "empty.json"}, 'empty.json: expected {"mcpServers"'),
        ({"mcp_servers_config_path": "bad_server.json"}, 'server \'s\' needs a "url" or a "command"'),
    ],
)
def test_mcp_entry_errors(tmp_path, mcp, needle):
    (tmp_path / "servers.json").write_text('{"mcpServers": {"s": {"command": "x"}}}')
    (tmp_path / "empty.json").write_text('{"mcpServers": {}}')
    (tmp_path / "bad_server.json").write_text('{"mcpServers": {"s": {"port": 1}}}')
    p = tmp_path / "mcp.yaml"
    p.write_text(
        json.dumps({"tools": [{"class_name": "slime.tools.mcp_tool.MCPTool", "config": {"type": "mcp"}, "mcp": mcp}]})
    )
    with pytest.raises(ToolConfigError) as e:
        load_tool_config(p)
    assert needle in str(e.value), str(e.value)


def test_mcp_section_needs_type_mcp_and_no_schema(tmp_path):
    (tmp_path / "s.json").write_text('{"mcpServers": {"s": {"url": "http://127.0.0.1:1/mcp"}}}')
    p = tmp_path / "t.yaml"
    p.write_text(
        json.dumps(
            {
                "tools": [
                    {
                        "class_name": "slime.tools.mcp_tool.MCPTool",
                        "config": {"type": "native"},
                        "mcp": {"mcp_servers_config_path": "s.json"},
                    }
                ]
            }
        )
    )
    with pytest.raises(ToolConfigError, match=r"tools\[0\]\.mcp: only used with config\.type: mcp"):
        load_tool_config(p)
    p.write_text(
        json.dumps(
            {
                "tools": [
                    {
                        "class_name": "slime.tools.mcp_tool.MCPTool",
                        "config": {"type": "mcp"},
                        "mcp": {"mcp_servers_config_path": "s.json"},
                        "tool_schema": {"function": {"name": "a"}},
                    }
                ]
            }
        )
    )
    with pytest.raises(ToolConfigError, match=r"tools\[0\]\.tool_schema: not used with config\.type: mcp"):
        load_tool_config(p)


@without_verl
def test_unmapped_verl_class_is_an_error_naming_the_mapped_ones(tmp_path):
    p = tmp_path / "zoom.yaml"
    p.write_text(
        json.dumps(
            {
                "tools": [
                    {
                        "class_name": "verl.tools.image_zoom_in_tool.ImageZoomInTool",
                        "config": {"type": "native"},
                        "tool_schema": {"function": {"name": "g"}},
                    }
                ]
            }
        )
    )
    with pytest.raises(ToolConfigError) as e:
        load_tool_config(p)
    assert (
        "tools[0].class_name: 'verl.tools.image_zoom_in_tool.ImageZoomInTool': verl is not installed and slime "
        "has no equivalent" in str(e.value)
    )
    assert str(e.value).endswith("point class_name at your own tool class (tool 'g')")
    assert all(name in str(e.value) for name in VERL_EQUIVALENTS)


def test_installed_verl_class_is_used_and_adapted(tmp_path, monkeypatch, caplog):
    """A stand-in `verl` package on sys.path: the YAML's class is verl's own, run through the adapter
    with verl's (stricter) schema model, and the log says so."""
    pkg = tmp_path / "fakeverl" / "verl" / "tools"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "schemas.py").write_text(
        textwrap.dedent("""
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
    """)
    )
    (pkg / "gsm8k_tool.py").write_text(
        textwrap.dedent("""
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
    """)
    )
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
