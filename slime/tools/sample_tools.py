"""A sample's own tools (`--tool-key`): slime's list of OpenAI tool schemas (or tool names, or that list
as JSON) and verl's `tools_kwargs` mapping, parsed into what `ToolSet.select` checks against the config."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from slime.tools.schemas import OpenAIFunctionToolSchema


@dataclass
class SampleTools:
    """One sample's tools: names (creation order), per-name verl kwargs, OpenAI schemas for `tools=`."""

    names: list[str]
    kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    schemas: list[dict[str, Any]] = field(default_factory=list)


def _tools_kwargs(value: Any) -> dict[str, dict[str, Any]]:
    """verl's tools_kwargs; tools whose entry is None are not used (Parquet stores the mapping as a
    struct over every row's tool names, so absent tools come back as None)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"tools_kwargs must be a mapping of tool name -> kwargs, got {type(value).__name__}")
    return {n: dict(v) if isinstance(v, dict) else {} for n, v in value.items() if v is not None}


def sample_tool_schemas(tools: Any) -> list[dict[str, Any]]:
    """slime's per-sample `tools` (OpenAI tool schemas, bare function dicts, or a JSON string of
    them) as validated OpenAI tool dicts for `apply_chat_template(tools=...)`."""
    return [schema for _, schema in _parse_sample_tools(tools, None)]


def decode_tools_value(value: Any) -> Any:
    """A per-sample tools value as plain data: a JSON string decoded, a numpy array (Parquet) as a list."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"the sample's tools are a string but not JSON: {e}") from e
    return value.tolist() if hasattr(value, "tolist") else value


def _parse_sample_tools(tools: Any, names: list[str] | None) -> list[tuple[str, dict[str, Any] | None]]:
    """(name, schema) per item; a plain-string item names a configured tool (schema None)."""
    tools = decode_tools_value(tools)
    if not isinstance(tools, (list, tuple)):
        raise ValueError(f"the sample's tools must be a list of tool schemas, got {type(tools).__name__}")
    out: list[tuple[str, dict[str, Any] | None]] = []
    for i, item in enumerate(tools):
        if isinstance(item, str) and names is not None:
            if item not in names:
                raise ValueError(f"the sample's tools[{i}]: no tool named {item!r} in the tool config ({names})")
            name, schema = item, None
        elif isinstance(item, dict):
            raw = item if "function" in item else {"type": "function", "function": item}
            try:
                schema = OpenAIFunctionToolSchema.model_validate(raw).to_openai()
            except ValidationError as e:
                err = e.errors()[0]
                raise ValueError(f"the sample's tools[{i}].{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from e
            name = schema["function"]["name"]
        else:
            raise ValueError(
                f"the sample's tools[{i}]: expected an OpenAI tool schema (a mapping)"
                f"{' or a tool name' if names is not None else ''}, got {type(item).__name__}"
            )
        if any(name == n for n, _ in out):
            raise ValueError(f"the sample's tools[{i}]: duplicate tool name {name!r}")
        out.append((name, schema))
    return out
