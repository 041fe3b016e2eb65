"""verl tool configs and tool classes, unchanged.

Two things make verl's tools run here:

1. `class_name: verl.tools.<module>.<Class>` in a tool YAML resolves to verl's own class when
   verl is importable, and otherwise to slime's equivalent from `VERL_EQUIVALENTS`; one log line
   says which. There is no fake `verl` package: a verl class without an equivalent is an error
   naming the classes that have one.

   | verl class_name                                | slime equivalent                                  |
   | ---------------------------------------------- | ------------------------------------------------- |
   | verl.tools.base_tool.BaseTool                  | slime.tools.base_tool.BaseTool                    |
   | verl.tools.gsm8k_tool.Gsm8kTool                | slime.tools.verl_answer_tools.VerlGsm8kTool       |
   | verl.tools.geo3k_tool.Geo3kTool                | slime.tools.verl_answer_tools.VerlGeo3kTool       |
   | verl.tools.sandbox_fusion_tools.SandboxFusionTool | slime.tools.sandbox_fusion_tool.SandboxFusionTool |
   | verl.tools.search_tool.SearchTool              | slime.tools.search_tool.SearchTool                |
   | verl.tools.mcp_base_tool.MCPBaseTool           | slime.tools.mcp_tool.MCPTool                      |
   | verl.tools.mcp_search_tool.MCPSearchTool       | slime.tools.mcp_tool.MCPSearchTool                |

2. A class written against verl's `BaseTool` (verl's own, or slime's names imported from
   `slime.tools`) is duck-typed: anything with `create`/`execute`/`calc_reward`/`release` is run
   through `VerlToolAdapter`, which gives the rollout loop one interface whatever the tool's
   vintage: `create` called either way (`create(iid, **kw)` or `create(create_kwargs=...)`),
   `execute` given `agent_data` when the tool takes it, results as `ToolResponse` or the older
   `(text, reward, metrics)` tuple, sync or async methods, rewards as floats.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import sys
from typing import Any
from uuid import uuid4

from pydantic import BaseModel, ValidationError

from slime.tools.base_tool import BaseTool, create_kwargs_of
from slime.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from slime.utils.misc import PluginLoadError, load_function

logger = logging.getLogger(__name__)

VERL_EQUIVALENTS: dict[str, str] = {
    "verl.tools.base_tool.BaseTool": "slime.tools.base_tool.BaseTool",
    "verl.tools.gsm8k_tool.Gsm8kTool": "slime.tools.verl_answer_tools.VerlGsm8kTool",  # verl's grading
    "verl.tools.geo3k_tool.Geo3kTool": "slime.tools.verl_answer_tools.VerlGeo3kTool",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "slime.tools.sandbox_fusion_tool.SandboxFusionTool",
    "verl.tools.search_tool.SearchTool": "slime.tools.search_tool.SearchTool",
    "verl.tools.mcp_base_tool.MCPBaseTool": "slime.tools.mcp_tool.MCPTool",
    "verl.tools.mcp_search_tool.MCPSearchTool": "slime.tools.mcp_tool.MCPSearchTool",
}

TOOL_METHODS = ("create", "execute", "calc_reward", "release")


def verl_installed() -> bool:
    return importlib.util.find_spec("verl") is not None


def resolve_tool_class(
    class_name: str, equivalents: dict[str, str] | None = None, kind: str = "tool"
) -> tuple[Any, str | None]:
    """(the object `class_name` names, a one-line note when a verl name was resolved). `equivalents`
    (default: the tool classes above) maps verl's names of this `kind` of class to slime's."""
    if class_name.split(".", 1)[0] != "verl":
        return load_function(class_name), None
    equivalents = VERL_EQUIVALENTS if equivalents is None else equivalents
    equivalent = equivalents.get(class_name)
    if verl_installed():
        try:
            return load_function(class_name), f"{class_name}: verl's own class (verl is installed)"
        except PluginLoadError as e:
            if equivalent is None:
                raise
            return load_function(equivalent), (
                f"{class_name} -> {equivalent}: verl is installed but its class "
                f"does not import ({e}); using slime's equivalent"
            )
    if equivalent is None:
        raise PluginLoadError(
            f"{class_name!r}: verl is not installed and slime has no equivalent of this class "
            f"(slime has: {sorted(equivalents)}); install verl, or point class_name at "
            f"your own {kind} class"
        )
    return load_function(equivalent), f"{class_name} -> {equivalent} (verl is not installed; slime's equivalent)"


def is_tool_class(obj: Any) -> bool:
    """A class with verl's tool methods (our BaseTool subclasses included)."""
    return isinstance(obj, type) and all(callable(getattr(obj, m, None)) for m in TOOL_METHODS)


def schema_class_for(cls: type) -> type[BaseModel] | None:
    """The `OpenAIFunctionToolSchema` the tool's own modules use (verl's, ours, or a copy), if any."""
    for klass in cls.__mro__:
        found = getattr(sys.modules.get(klass.__module__), "OpenAIFunctionToolSchema", None)
        if isinstance(found, type) and issubclass(found, BaseModel):
            return found
    return None


def as_our_schema(schema: Any) -> OpenAIFunctionToolSchema:
    """verl's schema model (or a dict) -> ours, so the loop validates and renders one type."""
    if isinstance(schema, OpenAIFunctionToolSchema):
        return schema
    if isinstance(schema, BaseModel):
        schema = schema.model_dump(exclude_none=True)
    return OpenAIFunctionToolSchema.model_validate(schema)


def as_response(value: Any) -> ToolResponse:
    """ToolResponse from ours, verl's (any object with text/image/video), a str, a dict, or None."""
    if isinstance(value, ToolResponse):
        return value
    if value is None:
        return ToolResponse()
    if isinstance(value, str):
        return ToolResponse(text=value)
    if isinstance(value, dict):
        return ToolResponse.model_validate(value)
    if any(hasattr(value, k) for k in ("text", "image", "video")):
        return ToolResponse(
            text=getattr(value, "text", None), image=getattr(value, "image", None), video=getattr(value, "video", None)
        )
    return ToolResponse(text=str(value))


class AgentDataView:
    """What a verl tool finds in `execute(..., agent_data=...)` when the caller gives none.

    verl's `AgentData` carries the loop's whole state; tools use it for `request_id`,
    `tools_kwargs` and `extra_fields` (session data kept across calls of one trajectory), which
    live here for the instance's lifetime. `messages` and media stay empty: this loop does not
    hand its history to tools.
    """

    def __init__(self, request_id: str, tools_kwargs: dict[str, Any] | None = None):
        self.request_id = request_id
        self.tools_kwargs = tools_kwargs or {}
        self.messages: list[dict[str, Any]] = []
        self.image_data: list[Any] = []
        self.video_data: list[Any] = []
        self.metrics: dict[str, Any] = {}
        self.interaction = None
        self.interaction_kwargs: dict[str, Any] = {}
        self.turn_scores: list[float] = []
        self.tool_rewards: list[float] = []
        self.extra_fields: dict[str, Any] = {}


class _Signature:
    """Which keyword arguments a method accepts (named ones, or anything via **kwargs)."""

    def __init__(self, fn: Any):
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):  # builtins / C callables: assume the permissive verl shape
            params = [inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
        self.named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        self.var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
        self.first_positional = next(
            (p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)), None
        )

    def accepts(self, name: str) -> bool:
        return self.var_kw or name in self.named


async def _resolve(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class VerlToolAdapter(BaseTool):
    """Runs a tool object written for verl's `BaseTool` behind slime's tool interface.

    The wrapped object is `inner`; unknown attributes are read from it, so tool-specific state
    (`tool._instance_dict`, ...) stays reachable.
    """

    def __init__(self, inner: Any):
        for m in TOOL_METHODS:
            if not callable(getattr(inner, m, None)):
                raise TypeError(f"{type(inner).__name__} has no {m}() method; a tool needs {list(TOOL_METHODS)}")
        self.inner = inner
        self.config = getattr(inner, "config", None) or {}
        schema = getattr(inner, "tool_schema", None)
        if schema is None and callable(getattr(inner, "get_openai_tool_schema", None)):
            schema = inner.get_openai_tool_schema()
        if schema is None:
            raise ValueError(f"{type(inner).__name__}: no tool_schema given and the class defines none")
        self.tool_schema = as_our_schema(schema)
        self.name = self.tool_schema.function.name
        self._create = _Signature(inner.create)
        self._execute = _Signature(inner.execute)
        self._agent_data: dict[str, AgentDataView] = {}
        self._warned: set[str] = set()

    @classmethod
    def build(
        cls, tool_class: type, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None
    ) -> "VerlToolAdapter":
        """Construct `tool_class(config=..., tool_schema=...)` with the schema type its module uses."""
        schema: Any = tool_schema
        own = schema_class_for(tool_class)
        if tool_schema is not None and own is not None and own is not OpenAIFunctionToolSchema:
            try:
                schema = own.model_validate(tool_schema.model_dump(exclude_none=True))
            except ValidationError:
                schema = tool_schema  # stricter than ours (e.g. verl's needs `type` on every property)
        return cls(tool_class(config=config, tool_schema=schema))

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (during __init__): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _warn_once(self, key: str, msg: str, *a: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(msg, *a)

    def _pass(self, sig: _Signature, method: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        refused = [k for k in kwargs if not sig.accepts(k)]
        if refused:
            raise TypeError(
                f"tool {self.name!r}: {type(self.inner).__name__}.{method}() does not accept "
                f"{sorted(refused)} (given in tools_kwargs)"
            )
        return kwargs

    async def create(
        self, instance_id: str | None = None, *, create_kwargs: dict[str, Any] | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        """Both conventions in, and out to the tool in the form it reads.

        A tool that names `create_kwargs` gets them as `create_kwargs=`; one that takes
        **kwargs gets them both flattened and as `create_kwargs=` (verl's own tools read either);
        one with named parameters only gets them flattened.
        """
        kw = create_kwargs_of(create_kwargs, kwargs)
        iid = instance_id or str(uuid4())
        sig = self._create
        call: dict[str, Any] = {}
        if sig.accepts("create_kwargs"):
            call["create_kwargs"] = kw
            flat = {k: v for k, v in kw.items() if k in sig.named or sig.var_kw}
        else:
            flat = self._pass(sig, "create", kw)
        call.update({k: v for k, v in flat.items() if k not in ("instance_id", "create_kwargs")})
        if "instance_id" in sig.named:
            got = await _resolve(self.inner.create(instance_id=iid, **call))
        elif sig.first_positional is not None:
            got = await _resolve(self.inner.create(iid, **call))
        else:  # create(**kw) without an id parameter: the tool picks its own id and returns it
            got = await _resolve(self.inner.create(**call))
        if isinstance(got, tuple):  # (instance_id, ToolResponse) since verl 0.5
            got_id, resp = (got + (None,))[:2]
        else:  # older verl tools return the id alone
            got_id, resp = got, None
        got_id = str(got_id) if got_id else iid
        self._agent_data[got_id] = AgentDataView(got_id, {self.name: {"create_kwargs": kw}})
        return got_id, as_response(resp)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], *, agent_data: Any = None, **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """`agent_data` goes to a tool that names it (a stand-in kept per instance when the caller has
        none), and to one taking **kwargs only when the caller gave it (as verl's loop does)."""
        call = dict(self._pass(self._execute, "execute", kwargs))
        if "agent_data" in self._execute.named:
            call["agent_data"] = (
                agent_data
                if agent_data is not None
                else (self._agent_data.get(instance_id) or AgentDataView(instance_id))
            )
        elif agent_data is not None and self._execute.var_kw:
            call["agent_data"] = agent_data
        got = await _resolve(self.inner.execute(instance_id, parameters, **call))
        if isinstance(got, (tuple, list)):
            if not 1 <= len(got) <= 3:
                raise TypeError(
                    f"tool {self.name!r}: execute() returned a {len(got)}-tuple; expected (response, reward, metrics)"
                )
            resp, reward, metrics = (*got, 0.0, {})[:3] if len(got) == 1 else (*got, {})[:3]
        else:  # a bare ToolResponse / text
            resp, reward, metrics = got, 0.0, {}
        return as_response(resp), self._number(reward, "execute() step reward"), dict(metrics or {})

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        got = await _resolve(self.inner.calc_reward(instance_id, **kwargs))
        return self._number(got, "calc_reward()")

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        try:
            await _resolve(self.inner.release(instance_id, **kwargs))
        finally:
            self._agent_data.pop(instance_id, None)

    def _number(self, value: Any, what: str) -> float:
        """verl's search/MCP tools return their result list from calc_reward: not a reward, so 0.0."""
        if value is None:
            return 0.0
        try:
            return float(value)
        except (TypeError, ValueError):
            self._warn_once(
                what, "tool %r: %s returned %s, not a number; counted as 0.0", self.name, what, type(value).__name__
            )
            return 0.0
