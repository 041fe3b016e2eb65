"""OpenAI Responses (`POST /v1/responses`) <-> chat-template terms. Pure functions of dicts.

`input` (a string or a list of items) becomes template messages: `instructions` -> system,
message items -> their role (developer -> system), consecutive assistant output (message text
and `function_call` items) -> one assistant message with `tool_calls`, `function_call_output` ->
a `tool` message, reasoning summaries -> `reasoning_content`. Stateless:
`previous_response_id` is refused, a client sends the whole input each turn.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

from slime.agent.gateway.errors import BadRequestError, FieldError, TurnRefused
from slime.agent.gateway.protocols import body_checks as check
from slime.agent.gateway.protocols.common import (
    bearer,
    flatten_content,
    header_session,
    logprob_entries,
    new_id,
    parse_arguments,
    sse,
    tool_call_dict,
    top_logprobs,
    want_stream,
)
from slime.agent.gateway.protocols.media import refuse_media, template_content
from slime.agent.gateway.protocols.tool_choice import names, offered, openai_choice
from slime.agent.gateway.protocols.openai_chat import body_session
from slime.agent.gateway.records import ChatRequest, Known, Reply

HISTORY = "input"  # the array holding the conversation, which grows turn by turn (`body_prefix`)
ROLES = frozenset({"user", "assistant", "system", "developer"})
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
SAMPLING_KEYS = {"max_output_tokens": "max_new_tokens", "temperature": "temperature", "top_p": "top_p"}
LOGPROBS_INCLUDE = "message.output_text.logprobs"  # the `include` value asking for the text's log-probs


def parse_request(
    body: dict[str, Any],
    headers: Mapping[str, str],
    session_id: str | None = None,
    known: Known | None = None,
    *,
    vision: bool = False,
    strings_checked: bool = False,
) -> ChatRequest:
    """`known`: what an earlier body made of this one's first input items (the same objects): only
    the items after them are checked and translated. `strings_checked`: as in `openai_chat.parse_request`."""
    if body.get("previous_response_id"):
        raise BadRequestError(
            "previous_response_id: this gateway keeps no responses; send the whole input (store=false)"
        )
    check_body(body, known.count if known else 0, vision=vision, strings_checked=strings_checked)
    items = body["input"]
    if isinstance(items, str):
        history, known = translate_items([{"role": "user", "content": items}]), None
    else:
        history = translate_items(items[known.count :], known.messages) if known else translate_items(items)
        known = Known(len(items), history)
    messages = (
        [{"role": "system", "content": flatten_content(body["instructions"])}] if body.get("instructions") else []
    ) + history
    tools = function_tools(body.get("tools"))
    choice = openai_choice(body, names(tools), responses=True)
    return ChatRequest(
        session_id=session_id or header_session(headers) or bearer(headers) or body_session(body) or "default",
        messages=messages,
        tools=offered(tools, choice),
        sampling={dst: body[src] for src, dst in SAMPLING_KEYS.items() if body.get(src) is not None},
        stream=want_stream(body, headers),
        model=str(body.get("model") or "slime-actor"),
        tool_choice=choice,
        logprobs=LOGPROBS_INCLUDE in (body.get("include") or []),
        top_logprobs=top_logprobs(body),
        raw=body,
        known=known,
    )


def check_body(
    body: Mapping[str, Any], checked: int = 0, *, vision: bool = False, strings_checked: bool = False
) -> None:
    """A `FieldError` naming the first malformed field (`body_checks`); the first `checked` input
    items passed in an earlier body of the session (`Known`)."""
    check.common(body, "input", checked, strings_checked=strings_checked)
    check.optional(body, "instructions", "string")
    check.integer(body, "max_output_tokens", 1, check.MAX_TOKENS_CAP)
    check.number(body, "temperature", 0, 2)
    check.number(body, "top_p", 0, 1, open_low=True)
    check.optional(body, "include", "array")
    top_logprobs(body)
    items = body.get("input")
    check.expect(items, "input", "string", "array")
    if not items:
        raise FieldError("input", "must not be empty")
    for i in range(checked, len(items) if isinstance(items, list) else 0):
        check_item(items[i], f"input[{i}]", vision=vision)
    for i, t in enumerate(body.get("tools") or []):
        check.block(t, f"tools[{i}]")
        if t["type"] == "function":
            check.nonempty_str(t.get("name"), f"tools[{i}].name")
            check.optional(t, "description", "string", path=f"tools[{i}].")
            check.json_schema(t.get("parameters"), f"tools[{i}].parameters")


def check_item(item: Any, path: str, *, vision: bool = False) -> None:
    """`vision`: `input_image` parts are read (`media`), else refused by path."""
    check.expect(item, path, "object")
    check.optional(item, "type", "string", path=f"{path}.")
    kind = item.get("type") or "message"
    if kind == "message":
        check.role(item.get("role", "user"), f"{path}.role", ROLES)
        check.text_parts(item.get("content"), f"{path}.content", TEXT_PARTS)
        refuse_media(item.get("content"), f"{path}.content", vision=vision)
    elif kind == "function_call":
        check.nonempty_str(item.get("name"), f"{path}.name")
        check.optional(item, "arguments", "string", "object", path=f"{path}.")
    elif kind == "function_call_output":
        check.text_parts(item.get("output"), f"{path}.output", TEXT_PARTS)
        refuse_media(item.get("output"), f"{path}.output", vision=vision)
    elif kind == "reasoning":
        check.optional(item, "summary", "array", path=f"{path}.")
        for j, part in enumerate(item.get("summary") or []):
            check.block(part, f"{path}.summary[{j}]")
            check.expect(part.get("text"), f"{path}.summary[{j}].text", "string")


def translate_items(items: list[Any], translated: list[dict] = ()) -> list[dict]:
    """`items` as template messages, continuing the translation `translated` of the items before
    them (never changed: an assistant message the items continue is copied first)."""
    out = list(translated)
    if out and out[-1]["role"] == "assistant":
        out[-1] = {**out[-1], **({"tool_calls": list(out[-1]["tool_calls"])} if "tool_calls" in out[-1] else {})}
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type") or "message"
        if kind == "function_call":
            _open_assistant(out).setdefault("tool_calls", []).append(
                tool_call_dict(item.get("name", "tool"), parse_arguments(item.get("arguments")))
            )
        elif kind == "reasoning":
            text = "".join(p.get("text", "") for p in item.get("summary") or [] if isinstance(p, dict))
            if text:
                _open_assistant(out)["reasoning_content"] = text
        elif kind == "function_call_output":
            out.append({"role": "tool", "content": template_content(item.get("output"))})
        elif kind == "message" and item.get("role") == "assistant":
            msg = _open_assistant(out)
            msg["content"] += flatten_content(item.get("content"))
        elif kind == "message":
            role = "system" if item.get("role") == "developer" else item.get("role", "user")
            out.append({"role": role, "content": template_content(item.get("content"))})
    return out


def _open_assistant(out: list[dict]) -> dict:
    """The assistant message being assembled: the last one, unless something followed it."""
    if out and out[-1]["role"] == "assistant":
        return out[-1]
    out.append({"role": "assistant", "content": ""})
    return out[-1]


def function_tools(tools: list[dict] | None) -> list[dict] | None:
    out = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description") or "",
                "parameters": t.get("parameters") or {"type": "object", "properties": {}},
            },
        }
        for t in tools or []
        if isinstance(t, dict) and t.get("type") == "function" and t.get("name")
    ]
    return out or None


def output_items(reply: Reply) -> list[dict]:
    items: list[dict] = []
    if reply.reasoning:
        items.append(
            {"type": "reasoning", "id": new_id("rs_"), "summary": [{"type": "summary_text", "text": reply.reasoning}]}
        )
    if reply.text or not reply.tool_uses:
        items.append(
            {
                "type": "message",
                "id": new_id("msg_"),
                "status": "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": reply.text, "annotations": [], "logprobs": logprob_entries(reply)}
                ],
            }
        )
    for u in reply.tool_uses:
        call_id = new_id("call_")
        items.append(
            {
                "type": "function_call",
                "id": new_id("fc_"),
                "call_id": call_id,
                "name": u.name,
                "arguments": json.dumps(u.arguments, ensure_ascii=False),
                "status": "completed",
            }
        )
    return items


def _response(reply: Reply, request: ChatRequest, output: list[dict], status: str) -> dict:
    u = reply.usage
    done = status != "in_progress"
    return {
        "id": new_id("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": request.model,
        "output": output,
        "parallel_tool_calls": request.tool_choice.parallel,
        "tool_choice": request.raw.get("tool_choice") or "auto",
        "tools": request.raw.get("tools") or [],
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "usage": {
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "total_tokens": u.input_tokens + u.output_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        if done
        else None,
    }


def render_reply(reply: Reply, request: ChatRequest) -> dict:
    return _response(reply, request, output_items(reply), _status(reply))


def _status(reply: Reply) -> str:
    return "incomplete" if reply.finish_reason == "length" else "completed"


def render_stream(reply: Reply, request: ChatRequest) -> Iterator[str]:
    """response.created, per item output_item.added / its deltas / output_item.done, then
    response.completed (or response.incomplete), each with a sequence number."""
    seq = iter(range(1 << 30))
    final = render_reply(reply, request)
    shell = {**final, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}

    def event(kind: str, **data: Any) -> str:
        return sse({"type": kind, "sequence_number": next(seq), **data}, kind)

    yield event("response.created", response=shell)
    yield event("response.in_progress", response=shell)
    for i, item in enumerate(final["output"]):
        yield from _item_events(event, i, item)
    yield event(f"response.{final['status']}", response=final)


def _item_events(event, i: int, item: dict) -> Iterator[str]:
    if item["type"] == "message":
        text, logprobs = item["content"][0]["text"], item["content"][0]["logprobs"]
        yield event("response.output_item.added", output_index=i, item={**item, "status": "in_progress", "content": []})
        part = {"type": "output_text", "text": "", "annotations": []}
        yield event("response.content_part.added", output_index=i, item_id=item["id"], content_index=0, part=part)
        yield event(
            "response.output_text.delta",
            output_index=i,
            item_id=item["id"],
            content_index=0,
            delta=text,
            logprobs=logprobs,
        )
        yield event(
            "response.output_text.done",
            output_index=i,
            item_id=item["id"],
            content_index=0,
            text=text,
            logprobs=logprobs,
        )
        yield event(
            "response.content_part.done",
            output_index=i,
            item_id=item["id"],
            content_index=0,
            part={**part, "text": text},
        )
    elif item["type"] == "function_call":
        yield event(
            "response.output_item.added", output_index=i, item={**item, "status": "in_progress", "arguments": ""}
        )
        yield event(
            "response.function_call_arguments.delta", output_index=i, item_id=item["id"], delta=item["arguments"]
        )
        yield event(
            "response.function_call_arguments.done",
            output_index=i,
            item_id=item["id"],
            arguments=item["arguments"],
            name=item["name"],
        )
    else:
        yield event("response.output_item.added", output_index=i, item=item)
    yield event("response.output_item.done", output_index=i, item=item)


def render_error(err: TurnRefused) -> dict:
    return {
        "error": {
            "message": str(err),
            "type": err.kind,
            "param": getattr(err, "param", None),
            "code": getattr(err, "code", None),
        }
    }
