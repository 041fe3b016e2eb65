"""Load verl-format tool YAML into tool objects.

Why a registry: tools often hold heavy shared resources (HTTP pools, rate limiters), so they are
built once per rollout runtime (`slime.tools.tool_sets.ToolSetCache`) and shared by every trajectory
(state is kept per `instance_id`), never per sample.
Config mistakes are reported as `file: tools[i].field: problem` so they can be fixed without
reading a traceback.

verl's YAMLs load unchanged: `verl.tools.*` class names resolve through
`slime.tools.verl_compat` (verl's class if installed, else slime's equivalent), classes written
against verl's BaseTool are wrapped in `VerlToolAdapter`, and `type: mcp` entries (with their
`mcp:` section) expand into one tool per MCP server tool (`slime.tools.mcp_tool`).
Per-sample tools (`--tool-key`) are resolved by `ToolSet.select` / `ToolSet.schemas_for`.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from pydantic import ValidationError

from slime.tools.base_tool import BaseTool, ToolConfigError
from slime.tools.sample_tools import (  # noqa: F401 - sample_tool_schemas, decode_tools_value: importable from here
    SampleTools,
    _parse_sample_tools,
    _tools_kwargs,
    decode_tools_value,
    sample_tool_schemas,
)
from slime.tools.schemas import OpenAIFunctionToolSchema
from slime.tools.services import ToolServices
from slime.tools.verl_compat import TOOL_METHODS, VerlToolAdapter, is_tool_class, resolve_tool_class
from slime.utils.misc import PluginLoadError

logger = logging.getLogger(__name__)

# native / sandbox_fusion: a Python class named by class_name; mcp: that class once per MCP server tool
SUPPORTED_TYPES = ("native", "sandbox_fusion", "mcp")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ToolSet:
    """The tools of one config, by name, with their argument validators."""

    def __init__(self, tools: list[BaseTool], source: str = "<memory>", entries: dict[str, int] | None = None):
        self.source = source
        self.entries = dict(entries or {})  # tool name -> index of its `tools[i]` entry in the file
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

    def entry_of(self, name: str) -> str:
        """Where the tool `name` is configured, as errors name it (`tools[i]`)."""
        i = self.entries.get(name)
        return f"tools[{i}]" if i is not None else f"tool {name!r}"

    def use_services(self, services: ToolServices) -> None:
        """Hand the run's shared services (sandbox URL, limiters) to every tool that wants them."""
        for tool in self.tools.values():
            hook = getattr(tool, "use_services", None)
            if callable(hook):
                hook(services)

    async def close(self) -> None:
        """Let every tool that holds a resource (an HTTP session, ...) give it back: a tool's `close()`
        is optional (verl's tools have none), sync or async."""
        for tool in self.tools.values():
            closer = getattr(tool, "close", None)
            if callable(closer):
                result = closer()
                if inspect.isawaitable(result):
                    await result

    def schemas(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        """OpenAI tool dicts for the chat template, in config order."""
        return [self.tools[n].tool_schema.to_openai() for n in (names if names is not None else self.names)]

    def select(self, tools: Any = None, tools_kwargs: Any = None) -> "SampleTools":
        """The tools one sample uses, their per-sample kwargs and the schemas its prompt shows.

        `tools` is the value `--tool-key` read: slime's list of OpenAI tool schemas (or tool names,
        or that list as a JSON string), or verl's `tools_kwargs` mapping (tool name -> {create_kwargs,
        execute_kwargs, calc_reward_kwargs, release_kwargs}). `tools_kwargs` is verl's mapping when
        it comes separately (a list there is read as `tools`: either key may hold either form).
        With neither, the sample uses every configured tool. A sample's own schema for a configured tool is what its prompt shows (slime renders the data's tools as
        given); arguments are still validated against the configured schema.
        """
        if isinstance(tools, dict) and tools_kwargs is None:
            tools, tools_kwargs = None, tools
        elif not tools and isinstance(tools_kwargs, (list, tuple, str)):  # slime's list under verl's key
            tools, tools_kwargs = tools_kwargs, None
        named = _tools_kwargs(tools_kwargs)
        unknown = [n for n in named if n not in self.tools]
        if unknown:
            raise ValueError(
                f"tools_kwargs names tool(s) {unknown} that are not in the tool config ({self.source}: {self.names})"
            )
        if tools is None or tools == []:
            names = list(named) if named else self.names
            return SampleTools(names, named, self.schemas(names))
        given = _parse_sample_tools(tools, self.names)
        names = [n for n, _ in given]
        unknown = [n for n in names if n not in self.tools]
        if unknown:
            raise ValueError(
                f"the sample's tools {unknown} are not in the tool config ({self.source}: "
                f"{self.names}); the model could call them but nothing would run them"
            )
        stray = [n for n in named if n not in names]
        if stray:
            raise ValueError(f"tools_kwargs names tool(s) {stray} that the sample's tools {names} do not offer")
        return SampleTools(
            names, named, [self.tools[n].tool_schema.to_openai() if schema is None else schema for n, schema in given]
        )

    def schemas_for(self, tools: Any = None, tools_kwargs: Any = None) -> list[dict[str, Any]]:
        """The chat template's `tools=` for one sample (see `select`)."""
        return self.select(tools, tools_kwargs).schemas

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


def _validate_schema(raw: Any, where: str) -> OpenAIFunctionToolSchema:
    try:
        schema = OpenAIFunctionToolSchema.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise ToolConfigError(
            f"{where}.tool_schema.{field}: {err['msg']}"
            + (f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else "")
        ) from e
    try:
        jsonschema.Draft202012Validator.check_schema(argument_schema(schema))
    except jsonschema.SchemaError as e:
        path = ".".join(str(p) for p in e.absolute_path)
        raise ToolConfigError(
            f"{where}.tool_schema.function.parameters{'.' + path if path else ''}: invalid JSON Schema: {e.message}"
        ) from e
    return schema


def instantiate(
    cls: type, config: dict[str, Any], schema: OpenAIFunctionToolSchema | None, class_name: str, where: str
) -> BaseTool:
    """`cls(config=, tool_schema=)`. slime's own tools follow the loop's interface as they are; any
    other class (verl's, or a user's written verl-style, whichever BaseTool it extends) is wrapped in
    `VerlToolAdapter`, which accepts every verl calling convention and return shape."""
    try:
        if issubclass(cls, BaseTool) and cls.__module__.split(".", 1)[0] == "slime":
            return cls(config=config, tool_schema=schema)
        return VerlToolAdapter.build(cls, config, schema)
    except Exception as e:  # noqa: BLE001 - the tool's own constructor failed; say which entry
        if schema is None:  # verl lets a class bring its own schema; this one does not
            raise ToolConfigError(
                f"{where}.tool_schema: required ({class_name} defines no schema of its own: {type(e).__name__}: {e})"
            ) from e
        raise ToolConfigError(f"{where}: {class_name}(...) failed: {type(e).__name__}: {e}") from e


def build_tools(entry: Any, where: str, base_dir: str | Path | None = None) -> list[BaseTool]:
    """One `tools[i]` entry -> its tool objects (one, or one per MCP server tool for `type: mcp`).

    `where` prefixes every error; `base_dir` (the YAML's folder) is where relative paths in the
    entry are also looked for.
    """
    if not isinstance(entry, dict):
        raise ToolConfigError(f"{where}: expected a mapping with class_name, config, tool_schema")
    unknown = set(entry) - {"class_name", "config", "tool_schema", "mcp"}
    if unknown:
        raise ToolConfigError(f"{where}: unknown field(s) {sorted(unknown)}")
    class_name = entry.get("class_name")
    if not isinstance(class_name, str) or not class_name:
        raise ToolConfigError(f"{where}.class_name: required, a dotted path like 'pkg.module.Class'")
    try:
        cls, note = resolve_tool_class(class_name)
    except PluginLoadError as e:
        raise ToolConfigError(f"{where}.class_name: {e}{_naming(entry)}") from e
    if note:
        logger.info("%s: %s", where, note)
    if not is_tool_class(cls):
        raise ToolConfigError(
            f"{where}.class_name: {class_name!r} is not a subclass of slime.tools.BaseTool "
            f"nor a verl-style tool class (one with {', '.join(TOOL_METHODS)})"
        )
    config = entry.get("config", {}) or {}
    if not isinstance(config, dict):
        raise ToolConfigError(f"{where}.config: expected a mapping")
    config = _expand_env(config, f"{where}.config")
    kind = config.get("type", "native")
    if kind not in SUPPORTED_TYPES:
        raise ToolConfigError(f"{where}.config.type: {kind!r} is not supported (supported: {list(SUPPORTED_TYPES)})")
    if kind == "mcp" or "mcp" in entry:
        if kind != "mcp":
            raise ToolConfigError(f"{where}.mcp: only used with config.type: mcp (this entry is {kind!r})")
        if not isinstance(entry.get("mcp"), dict):
            raise ToolConfigError(
                f"{where}.config.type: 'mcp' is not supported without an `mcp:` section "
                f"(mcp_servers_config_path, optional tool_selected_list)"
            )
        if "tool_schema" in entry:
            raise ToolConfigError(
                f"{where}.tool_schema: not used with config.type: mcp (the schemas come from "
                f"the MCP servers); remove it, or use tool_selected_list to pick tools"
            )
        from slime.tools.mcp_tool import build_mcp_tools

        return build_mcp_tools(
            cls,
            class_name,
            config,
            _expand_env(entry["mcp"], f"{where}.mcp"),
            where,
            base_dir=base_dir,
            instantiate=instantiate,
        )
    schema = _validate_schema(entry["tool_schema"], where) if entry.get("tool_schema") is not None else None
    tool = instantiate(cls, config, schema, class_name, where)
    if schema is None:  # the class brought its own: check it like a configured one
        _validate_schema(tool.tool_schema.model_dump(exclude_none=True), where)
    return [tool]


def _naming(entry: dict[str, Any]) -> str:
    """` (tool 'x')` when the entry's schema names its tool, so an error says which tool it stops."""
    schema = entry.get("tool_schema")
    function = schema.get("function") if isinstance(schema, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return f" (tool {name!r})" if isinstance(name, str) and name else ""


def build_tool(entry: Any, where: str) -> BaseTool:
    """One `tools[i]` entry that makes exactly one tool (every type but mcp)."""
    tools = build_tools(entry, where)
    if len(tools) != 1:
        raise ToolConfigError(f"{where}: makes {len(tools)} tools; use build_tools")
    return tools[0]


def read_yaml(path: str) -> Any:
    """The YAML document of `path`; a `ToolConfigError` naming the file and the line when it is not
    UTF-8, not YAML, or nested too deeply to read."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ToolConfigError(f"{path}: cannot read: {e}") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise ToolConfigError(
            f"{path}: line {line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {column})"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ToolConfigError(f"{path}: invalid YAML{where}: {e.problem or e.context}") from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow
        line = text.count("\n", 0, e.position) + 1
        raise ToolConfigError(f"{path}: invalid YAML at line {line}: {e.reason} (character {e.character!r})") from None
    except RecursionError:
        raise ToolConfigError(f"{path}: invalid YAML: nested too deeply to read") from None


def load_tool_config(path: str | Path) -> ToolSet:
    """Parse and build every tool of a YAML file (always builds new objects; shared ones: `ToolSetCache`)."""
    path = str(path)
    data = read_yaml(path)
    if isinstance(data, dict) and "tools" not in data and "interaction" in data:
        raise ToolConfigError(
            f"{path}: interaction: this is a verl interaction config ("
            f"{_interaction_names(data['interaction'])}), not a tool config: give it to "
            f"--interaction-config-path (--tool-config-path takes a top-level 'tools:' list)"
        )
    if not isinstance(data, dict) or not isinstance(data.get("tools"), list):
        raise ToolConfigError(f"{path}: expected a top-level 'tools:' list")
    tools, seen = [], {}
    for i, entry in enumerate(data["tools"]):
        for tool in build_tools(entry, f"{path}: tools[{i}]", base_dir=os.path.dirname(os.path.abspath(path))):
            if tool.name in seen:
                raise ToolConfigError(
                    f"{path}: tools[{i}].tool_schema.function.name: duplicate tool name "
                    f"{tool.name!r} (already used by tools[{seen[tool.name]}])"
                )
            seen[tool.name] = i
            tools.append(tool)
    return ToolSet(tools, source=path, entries=seen)


def _interaction_names(entries: Any) -> str:
    """verl's `interaction:` entries as `name (class_name)`, for the redirection."""
    items = entries if isinstance(entries, list) else []
    named = [
        f"{e['name']!r} ({e.get('class_name')})" if "name" in e else str(e.get("class_name"))
        for e in items
        if isinstance(e, dict)
    ]
    return ", ".join(named) or "its entries"


def start_shared_services(path: str | Path) -> tuple[ToolServices, list[Any]]:
    """For the RolloutManager, before any rollout: each tool class of the config starts what its
    instances share across the cluster (`BaseTool.start_shared_services`). Returns the services to
    hand down and the handles to keep (and stop) for the run. A config that cannot be read yields
    nothing here: loading it for the rollout reports what is wrong, naming the file and entry."""
    services, handles = ToolServices(), []
    try:
        with open(path) as f:
            entries = (yaml.safe_load(f) or {}).get("tools") or []
    except (OSError, yaml.YAMLError, AttributeError):
        return services, handles
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
            continue
        try:
            cls, _ = resolve_tool_class(entry["class_name"])
        except PluginLoadError:
            continue
        start = getattr(cls, "start_shared_services", None)
        if callable(start):
            name = ((entry.get("tool_schema") or {}).get("function") or {}).get("name") or cls.__name__
            start(name, entry.get("config") or {}, services, handles)
    return services, handles
