"""`tool_choice` and parallel calls in each API's spelling -> one `ToolChoice`, checked against the
request's tools (a named tool that is not offered is a 400 naming the field).

What each choice does is decided once, in the pipeline and `engine_call`: `none` offers no tools
(SGLang's rule: the template gets none, no call is parsed); `required` and a named tool start the
answer with the call's opening (`parsing.forced_call_prefix`); `parallel` False stops the engine
at the first call's close.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slime.agent.gateway.errors import FieldError
from slime.agent.gateway.protocols import body_checks as check
from slime.agent.gateway.records import ToolChoice

AUTO = ToolChoice("auto", None, True)  # the default: the model decides, any number of calls
OPENAI_MODES = {"auto": "auto", "none": "none", "required": "required"}
ANTHROPIC_MODES = {"auto": "auto", "none": "none", "any": "required"}


def openai_choice(body: Mapping[str, Any], tool_names: list[str], *, responses: bool = False) -> ToolChoice:
    """Chat Completions (`{"type": "function", "function": {"name": ..}}`) or Responses
    (`{"type": "function", "name": ..}`) `tool_choice`, and `parallel_tool_calls`."""
    if "tool_choice" not in body and "parallel_tool_calls" not in body:
        return AUTO  # (what the rest makes of neither key, as one frozen object)
    check.optional(body, "parallel_tool_calls", "boolean")
    parallel = body.get("parallel_tool_calls") is not False
    value = body.get("tool_choice")
    if value is None or (isinstance(value, str) and value in OPENAI_MODES):
        return _checked(ToolChoice(OPENAI_MODES[value or "auto"], None, parallel), tool_names, "tool_choice")
    check.expect(value, "tool_choice", "string", "object")
    if isinstance(value, str) or value.get("type") != "function":
        raise FieldError(
            "tool_choice",
            f"must be none, auto, required or a function tool; got {value!r:.80} "
            "(this gateway serves function tools only)",
        )
    where = "tool_choice.name" if responses else "tool_choice.function.name"
    name = value.get("name") if responses else (value.get("function") or {}).get("name")
    check.nonempty_str(name, where)
    return _checked(ToolChoice("required", name, parallel), tool_names, where)


def anthropic_choice(body: Mapping[str, Any], tool_names: list[str]) -> ToolChoice:
    """Messages' `{"type": auto|any|none|tool, "name": .., "disable_parallel_tool_use": ..}`."""
    value = body.get("tool_choice")
    if value is None:
        return ToolChoice()
    check.expect(value, "tool_choice", "object")
    check.optional(value, "disable_parallel_tool_use", "boolean", path="tool_choice.")
    parallel = value.get("disable_parallel_tool_use") is not True
    kind = value.get("type")
    if kind in ANTHROPIC_MODES:
        return _checked(ToolChoice(ANTHROPIC_MODES[kind], None, parallel), tool_names, "tool_choice")
    if kind != "tool":
        raise FieldError("tool_choice.type", f"must be one of auto, any, none, tool; got {kind!r:.60}")
    check.nonempty_str(value.get("name"), "tool_choice.name")
    return _checked(ToolChoice("required", value["name"], parallel), tool_names, "tool_choice.name")


def _checked(choice: ToolChoice, tool_names: list[str], where: str) -> ToolChoice:
    if choice.mode == "required" and not tool_names:
        raise FieldError(where, "asks for a tool call, but the request offers no tools")
    if choice.name is not None and choice.name not in tool_names:
        raise FieldError(
            where,
            f"names the tool {choice.name!r:.60}, which is not among the request's tools "
            f"({', '.join(tool_names) or 'none'})",
        )
    return choice


def offered(tools: list[dict[str, Any]] | None, choice: ToolChoice) -> list[dict[str, Any]] | None:
    """The tools the template gets: none under `tool_choice` none (as SGLang renders it), so the
    model is not shown tools it may not call and nothing it writes is parsed as a call."""
    return None if choice.mode == "none" else tools


def names(tools: list[dict[str, Any]] | None) -> list[str]:
    return [t["function"]["name"] for t in tools or []]
