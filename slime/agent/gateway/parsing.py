"""The model's text -> reasoning, visible text and tool calls (slime's `slime.agent.gateway.parsing` API).

Tool calls are read by the project's parser registry (`slime.tools.chat_format.get_parser`, the
`--tool-call-parser` of the tool loop), so both paths read a model's calls the same way; a call
the parser rejects marks the turn ill-formed instead of vanishing. Without a named parser, and as
a fallback when it finds nothing, Qwen3-Coder's XML form `<tool_call><function=..>` is read.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from slime.agent.gateway.records import ToolChoice, one_step_init
from slime.tools.chat_format import HermesParser, get_parser

_XML_CALL = re.compile(r"<tool_call>\s*<function=([^>]+)>(.*?)</function>\s*</tool_call>", re.DOTALL)
_XML_PARAM = re.compile(r"<parameter=([^>]+)>(.*?)</parameter>", re.DOTALL)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_CLOSE = HermesParser.CLOSE  # where a call ends, in the Hermes form and the XML fallback alike


@one_step_init
@dataclasses.dataclass(frozen=True)
class ParsedModelOutput:
    reasoning: str
    text: str
    tool_uses: list[dict[str, Any]]  # {"name": str, "input": dict}
    ill_formed: bool = False


def split_reasoning(raw: str) -> tuple[str, str]:
    """(reasoning, rest) for a `<think>...</think>` model; ("", raw) when it did not close a block."""
    if THINK_CLOSE not in raw:
        return "", raw
    reasoning, rest = raw.split(THINK_CLOSE, 1)
    return reasoning.replace(THINK_OPEN, "", 1).strip(), rest.lstrip("\n")


def parse_model_output(
    raw_output: str,
    *,
    tools_schema: list[dict] | None,
    tool_parser_name: str | None,
    reasoning_parser_name: str | None,
    cut_off: bool = False,
) -> ParsedModelOutput:
    """`reasoning_parser_name` (any name) splits off a `<think>` block; `cut_off`: the turn hit the
    length limit, so an unclosed call was cut rather than malformed."""
    reasoning, body = split_reasoning(raw_output) if reasoning_parser_name else ("", raw_output)
    tool_uses: list[dict[str, Any]] = []
    ill_formed = False
    if tools_schema and tool_parser_name:
        result = get_parser(tool_parser_name).parse(body, cut_off=cut_off)
        if result.calls or result.errors:
            body, ill_formed = result.content, bool(result.errors)
            tool_uses = [
                {
                    "name": c.name,
                    "input": c.arguments if isinstance(c.arguments, dict) else {"_raw_arguments": c.arguments},
                }
                for c in result.calls
            ]
    if not tool_uses and tools_schema:
        body, tool_uses = parse_xml_tool_uses(body, tools_schema)
    return ParsedModelOutput(reasoning=reasoning, text=body.strip(), tool_uses=tool_uses, ill_formed=ill_formed)


def parse_xml_tool_uses(body_text: str, tools_schema: list[dict]) -> tuple[str, list[dict[str, Any]]]:
    """Calls of known tools in `<tool_call><function=NAME><parameter=K>V</parameter>...` form, and the
    text without them; a call of an unknown tool stays in the text."""
    known = {(t.get("function") or {}).get("name") for t in tools_schema}
    uses: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for m in _XML_CALL.finditer(body_text):
        if m.group(1) in known:
            uses.append(
                {"name": m.group(1), "input": {p.group(1): p.group(2).strip() for p in _XML_PARAM.finditer(m.group(2))}}
            )
            kept.append(body_text[last : m.start()])
            last = m.end()
    kept.append(body_text[last:])
    return "".join(kept), uses


def forced_call_prefix(choice: ToolChoice) -> str:
    """The opening of the answer when the client requires a call (`required`, or a named tool): the
    Hermes call up to where the model's choice starts -- its name, or, for a named tool, its
    arguments. It goes at the end of the prompt (template tokens, mask 0); the model samples the
    rest, and an answer that still makes no valid call is returned and trained as sampled."""
    if choice.mode != "required":
        return ""
    if choice.name is None:
        return f'{HermesParser.OPEN}\n{{"name": "'
    return f'{HermesParser.OPEN}\n{{"name": {json.dumps(choice.name, ensure_ascii=False)}, "arguments": '
