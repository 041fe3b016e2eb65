"""Load verl-format tool YAML into tool objects, once per process.

Why a registry: tools often hold heavy shared resources (HTTP pools, rate limiters), so they are
built once and shared by every trajectory (state is kept per `instance_id`), never per sample.
Config mistakes are reported as `file: tools[i].field: problem` so they can be fixed without
reading a traceback.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from pydantic import ValidationError

from slime.tools.base_tool import BaseTool
from slime.tools.schemas import OpenAIFunctionToolSchema
from slime.utils.misc import PluginLoadError, load_function

SUPPORTED_TYPES = ("native", "sandbox_fusion")  # both are Python classes named by class_name
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ToolConfigError(ValueError):
    """A tool YAML that cannot be loaded; the message names file, entry and field."""


class ToolSet:
    """The tools of one config, by name, with their argument validators."""

    def __init__(self, tools: list[BaseTool], source: str = "<memory>"):
        self.source = source
        self.tools: dict[str, BaseTool] = {}
        self.validators: dict[str, jsonschema.Draft202012Validator] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ToolConfigError(f"{source}: duplicate tool name {tool.name!r}")
            self.tools[tool.name] = tool
            self.validators[tool.name] = jsonschema.Draft202012Validator(argument_schema(tool.tool_schema))

    def __contains__(self, name: str) -> bool:
        return name in self.tools

    def __getitem__(self, name: str) -> BaseTool:
        return self.tools[name]

    @property
    def names(self) -> list[str]:
        return list(self.tools)

    def schemas(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        """OpenAI tool dicts for the chat template, in config order."""
        return [self.tools[n].tool_schema.to_openai() for n in (names if names is not None else self.names)]

    def check_arguments(self, name: str, arguments: Any) -> tuple[dict[str, Any] | None, str | None]:
        """(arguments with top-level defaults filled, None) or (None, what is wrong)."""
        if not isinstance(arguments, dict):
            return None, f"arguments must be a JSON object, got {type(arguments).__name__}"
        errors = sorted(self.validators[name].iter_errors(arguments), key=lambda e: list(e.absolute_path))
        if errors:
            parts = []
            for e in errors[:5]:
                where = "/".join(str(p) for p in e.absolute_path) or "(root)"
                parts.append(f"{where}: {e.message}")
            return None, "; ".join(parts)
        filled = dict(arguments)
        props = self.tools[name].tool_schema.function.parameters.properties
        for key, prop in props.items():
            extra = prop.model_extra or {}
            if key not in filled and "default" in extra:
                filled[key] = extra["default"]
        return filled, None


def argument_schema(tool_schema: OpenAIFunctionToolSchema) -> dict[str, Any]:
    """The JSON Schema arguments are validated against.

    Arguments the schema does not declare are rejected unless the schema sets
    `additionalProperties` itself: a model must not pass options (timeouts, languages) it was
    never offered.
    """
    schema = tool_schema.function.parameters.model_dump(exclude_none=True)
    schema.setdefault("additionalProperties", False)
    return schema


def _expand_env(value: Any, where: str) -> Any:
    if isinstance(value, str):
        def sub(m: re.Match) -> str:
            if m.group(1) not in os.environ:
                raise ToolConfigError(f"{where}: environment variable {m.group(1)!r} is not set")
            return os.environ[m.group(1)]
        return _ENV.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand_env(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def build_tool(entry: Any, where: str) -> BaseTool:
    """One `tools[i]` entry -> a tool object; `where` prefixes every error."""
    if not isinstance(entry, dict):
        raise ToolConfigError(f"{where}: expected a mapping with class_name, config, tool_schema")
    unknown = set(entry) - {"class_name", "config", "tool_schema"}
    if unknown:
        raise ToolConfigError(f"{where}: unknown field(s) {sorted(unknown)}")
    class_name = entry.get("class_name")
    if not isinstance(class_name, str) or not class_name:
        raise ToolConfigError(f"{where}.class_name: required, a dotted path like 'pkg.module.Class'")
    try:
        cls = load_function(class_name)
    except PluginLoadError as e:
        raise ToolConfigError(f"{where}.class_name: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
        raise ToolConfigError(f"{where}.class_name: {class_name!r} is not a subclass of slime.tools.BaseTool")
    config = entry.get("config", {}) or {}
    if not isinstance(config, dict):
        raise ToolConfigError(f"{where}.config: expected a mapping")
    config = _expand_env(config, f"{where}.config")
    kind = config.get("type", "native")
    if kind not in SUPPORTED_TYPES:
        raise ToolConfigError(f"{where}.config.type: {kind!r} is not supported (supported: {list(SUPPORTED_TYPES)})")
    if "tool_schema" not in entry:
        raise ToolConfigError(f"{where}.tool_schema: required")
    try:
        schema = OpenAIFunctionToolSchema.model_validate(entry["tool_schema"])
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise ToolConfigError(f"{where}.tool_schema.{field}: {err['msg']}"
                              + (f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else "")) from e
    try:
        jsonschema.Draft202012Validator.check_schema(argument_schema(schema))
    except jsonschema.SchemaError as e:
        path = ".".join(str(p) for p in e.absolute_path)
        raise ToolConfigError(f"{where}.tool_schema.function.parameters{'.' + path if path else ''}: "
                              f"invalid JSON Schema: {e.message}") from e
    try:
        return cls(config=config, tool_schema=schema)
    except Exception as e:  # noqa: BLE001 - the tool's own constructor failed; say which entry
        raise ToolConfigError(f"{where}: {class_name}(...) failed: {type(e).__name__}: {e}") from e


def load_tool_config(path: str | Path) -> ToolSet:
    """Parse and build every tool of a YAML file (always builds new objects; see `get_tool_set`)."""
    path = str(path)
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ToolConfigError(f"{path}: cannot read: {e}") from e
    except yaml.YAMLError as e:
        raise ToolConfigError(f"{path}: invalid YAML: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("tools"), list):
        raise ToolConfigError(f"{path}: expected a top-level 'tools:' list")
    tools, seen = [], {}
    for i, entry in enumerate(data["tools"]):
        tool = build_tool(entry, f"{path}: tools[{i}]")
        if tool.name in seen:
            raise ToolConfigError(f"{path}: tools[{i}].tool_schema.function.name: duplicate tool name "
                                  f"{tool.name!r} (already used by tools[{seen[tool.name]}])")
        seen[tool.name] = i
        tools.append(tool)
    return ToolSet(tools, source=path)


_cache: dict[str, ToolSet] = {}
_lock = threading.Lock()


def get_tool_set(path: str | Path) -> ToolSet:
    """The process-wide tools of a config file: built on first use, then shared."""
    key = os.path.abspath(str(path))
    with _lock:
        if key not in _cache:
            _cache[key] = load_tool_config(path)
        return _cache[key]


def clear_tool_cache() -> None:
    with _lock:
        _cache.clear()
