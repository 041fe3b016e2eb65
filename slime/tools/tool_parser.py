"""Read tool calls out of model text; every problem is reported, nothing is dropped.

A parser returns the calls it could read *and* the errors for what it could not (bad JSON, a
missing name, an unclosed call cut off by the length limit), so the loop can answer each error
to the model and record it on the sample instead of silently ignoring it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class ToolCall:
    name: str
    arguments: Any
    raw: str
    index: int  # position among the calls (and errors) of this turn
    call_id: str = ""


@dataclass
class ParseError:
    kind: str  # "malformed_json" | "bad_call" | "cut_off" | "unclosed" | "unmatched_close"
    message: str
    raw: str
    index: int


@dataclass
class ParseResult:
    content: str  # the text before the first call (what a chat message's `content` would hold)
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)

    @property
    def items(self) -> list[ToolCall | ParseError]:
        """Calls and errors in the order they appeared, so answers keep the model's order."""
        return sorted([*self.calls, *self.errors], key=lambda x: x.index)


class ToolCallParser:
    name = "base"

    def parse(self, text: str, cut_off: bool = False) -> ParseResult:
        """`cut_off`: the turn ended at the length limit, so an unclosed call was cut, not forgotten."""
        raise NotImplementedError


PARSERS: dict[str, type[ToolCallParser]] = {}


def register_parser(*names: str) -> Callable[[type[ToolCallParser]], type[ToolCallParser]]:
    def deco(cls: type[ToolCallParser]) -> type[ToolCallParser]:
        for n in names:
            PARSERS[n] = cls
        return cls
    return deco


def get_parser(name: str) -> ToolCallParser:
    if name not in PARSERS:
        raise ValueError(f"--tool-call-parser {name!r}: unknown parser (known: {sorted(PARSERS)})")
    return PARSERS[name]()


def _snippet(s: str, n: int = 200) -> str:
    return s if len(s) <= n else s[:n] + "..."


@register_parser("hermes", "qwen", "qwen25", "qwen3")
class HermesParser(ToolCallParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number per turn."""

    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _tag = re.compile(r"<tool_call>|</tool_call>")

    def parse(self, text: str, cut_off: bool = False) -> ParseResult:
        first = text.find(self.OPEN)
        content = text if first < 0 else text[:first]
        result = ParseResult(content=content[:-1] if content.endswith("\n") else content)
        idx, pos, open_at = 0, 0, None
        for m in self._tag.finditer(text):
            if m.group() == self.OPEN:
                if open_at is not None:  # a new call opened before the last one closed
                    raw = text[open_at:m.start()]
                    result.errors.append(ParseError("unclosed", "a <tool_call> was not closed with </tool_call> "
                                                    "before the next <tool_call>", _snippet(raw), idx))
                    idx += 1
                open_at = m.end()
            else:
                if open_at is None:
                    result.errors.append(ParseError("unmatched_close", "</tool_call> without a matching <tool_call>",
                                                    _snippet(text[pos:m.end()]), idx))
                    idx += 1
                else:
                    result_item = self._parse_body(text[open_at:m.start()], idx)
                    (result.calls if isinstance(result_item, ToolCall) else result.errors).append(result_item)
                    idx += 1
                    open_at = None
            pos = m.end()
        if open_at is not None:
            raw = text[open_at:]
            if cut_off:
                result.errors.append(ParseError("cut_off", "the tool call was cut off by the length limit before "
                                                "</tool_call>; it was not executed", _snippet(raw), idx))
            else:
                result.errors.append(ParseError("unclosed", "<tool_call> was never closed with </tool_call>; "
                                                "it was not executed", _snippet(raw), idx))
        return result

    @staticmethod
    def _parse_body(body: str, idx: int) -> ToolCall | ParseError:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            return ParseError("malformed_json", f"the tool call is not valid JSON ({e.msg} at line {e.lineno} "
                              f"column {e.colno})", _snippet(body.strip()), idx)
        if not isinstance(obj, dict):
            return ParseError("bad_call", "a tool call must be a JSON object with 'name' and 'arguments'",
                              _snippet(body.strip()), idx)
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            return ParseError("bad_call", "the tool call has no 'name' string", _snippet(body.strip()), idx)
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models emit arguments as a JSON string
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                return ParseError("malformed_json", f"the 'arguments' string of {name!r} is not valid JSON ({e.msg})",
                                  _snippet(body.strip()), idx)
        return ToolCall(name=name, arguments=args, raw=body.strip(), index=idx)
