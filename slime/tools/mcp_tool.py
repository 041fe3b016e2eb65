"""MCP tools: verl's `type: mcp` entries (one tool per tool of the MCP servers).

A verl entry looks like
    - class_name: verl.tools.mcp_search_tool.MCPSearchTool
      config: {type: mcp, rate_limit: 120, timeout: 120}
      mcp: {mcp_servers_config_path: ./mcp_server.json, tool_selected_list: [tavily_search_tool]}
with no tool_schema: the schemas are listed from the servers. The servers file is verl's (and
Claude Desktop's) `{"mcpServers": {name: {"url": ..., "auth_token": ...} | {"command": ..., "args": [...]}}}`.

Status: the entry is accepted and validated in full (fields, servers file), then building the
tools fails at load time, naming the entry, the class and what is missing (the `mcp` client
library; and this slime has no MCP client yet even with it), never later mid-rollout. With verl
installed, its own MCP classes are refused the same way (verl's client set-up is verl's).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Callable

from slime.tools.base_tool import BaseTool

MCP_FIELDS = ("mcp_servers_config_path", "tool_selected_list")


def mcp_client_available() -> bool:
    return importlib.util.find_spec("mcp") is not None


def _error(message: str) -> Exception:
    from slime.tools.base_tool import ToolConfigError

    return ToolConfigError(message)


def read_servers_file(path_value: Any, where: str, base_dir: str | Path | None) -> tuple[Path, dict[str, Any]]:
    """(resolved path, mcpServers mapping); relative paths are tried from the CWD (verl's rule) and
    then from the tool YAML's folder."""
    if not isinstance(path_value, str) or not path_value:
        raise _error(f"{where}.mcp.mcp_servers_config_path: required, the JSON file listing the MCP servers")
    candidates = [Path(path_value)]
    if base_dir is not None and not os.path.isabs(path_value):
        candidates.append(Path(base_dir) / path_value)
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise _error(
            f"{where}.mcp.mcp_servers_config_path: no such file {path_value!r} (looked in "
            f"{', '.join(str(p.parent.resolve()) for p in candidates)})"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise _error(f"{where}.mcp.mcp_servers_config_path: {path}: not readable JSON: {e}") from e
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict) or not servers:
        raise _error(
            f'{where}.mcp.mcp_servers_config_path: {path}: expected {{"mcpServers": {{name: '
            f'{{"url": ...}} or {{"command": ...}}}}}} with at least one server'
        )
    for name, server in servers.items():
        if not isinstance(server, dict) or not (
            isinstance(server.get("url"), str) or isinstance(server.get("command"), str)
        ):
            raise _error(f'{where}.mcp.mcp_servers_config_path: {path}: server {name!r} needs a "url" or a "command"')
    return path, servers


def build_mcp_tools(
    cls: type,
    class_name: str,
    config: dict[str, Any],
    section: dict[str, Any],
    where: str,
    *,
    base_dir: str | Path | None,
    instantiate: Callable[..., BaseTool],
) -> list[BaseTool]:
    """The tools of one `type: mcp` entry (see the module docstring)."""
    unknown = set(section) - set(MCP_FIELDS)
    if unknown:
        raise _error(f"{where}.mcp: unknown field(s) {sorted(unknown)} (known: {list(MCP_FIELDS)})")
    selected = section.get("tool_selected_list")
    if selected is not None and not (isinstance(selected, list) and all(isinstance(s, str) for s in selected)):
        raise _error(f"{where}.mcp.tool_selected_list: expected a list of tool names")
    path, _servers = read_servers_file(section.get("mcp_servers_config_path"), where, base_dir)
    if cls.__module__.split(".", 1)[0] == "verl":
        raise _error(
            f"{where}: {class_name} is verl's own MCP class; verl's MCP client set-up is not driven from "
            f"slime. Use slime.tools.mcp_tool.MCPSearchTool (or MCPTool) as class_name, or uninstall "
            f"verl to have it mapped"
        )
    tools = f"MCP tools {selected}" if selected else "MCP tools"
    if not mcp_client_available():
        raise _error(
            f"{where} ({class_name}, config.type: mcp): cannot create the {tools} of {path}: the MCP "
            f"client library is not installed (pip install mcp)"
        )
    raise _error(
        f"{where} ({class_name}, config.type: mcp): cannot create the {tools} of {path}: the `mcp` "
        f"package is installed, but this slime has no MCP client yet; wrap your MCP server in a native "
        f"tool class for now"
    )


class MCPTool(BaseTool):
    """verl's MCPBaseTool: one MCP server tool. Built only by `build_mcp_tools` (see above)."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        raise NotImplementedError("MCP tools are built by slime.tools.mcp_tool.build_mcp_tools")


class MCPSearchTool(MCPTool):
    """verl's MCPSearchTool (a search MCP server's results as text)."""
