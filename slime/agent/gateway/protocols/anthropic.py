"""Anthropic Messages (`POST /v1/messages`) <-> chat-template terms. Pure functions of dicts.

`parse_request` folds system messages met mid-list into a user turn (most templates accept a
system message only first), turns content blocks into template messages (thinking ->
`reasoning_content`, tool_use -> `tool_calls`, tool_result -> a `tool` message) and the tool
list into the function schema; `render_reply` / `render_stream` answer in Messages' JSON or
SSE events; `render_error` in its error shape.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from typing import Any

from slime.agent.gateway.errors import FieldError, TurnRefused
from slime.agent.gateway.protocols import body_checks as check
from slime.agent.gateway.protocols.common import (
    bearer,
    flatten_content,
    header_session,
    new_id,
    sse,
    tool_call_dict,
    want_stream,
)
from slime.agent.gateway.protocols.media import has_images, refuse_media, template_content
from slime.agent.gateway.protocols.tool_choice import anthropic_choice, names, offered
from slime.agent.gateway.records import ChatRequest, Known, Reply

REMINDER_OPEN, REMINDER_CLOSE = "<system-reminder>\n", "\n</system-reminder>\n"
STOP_REASON = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}
HISTORY = "messages"  # the array holding the conversation, which grows turn by turn (`body_prefix`)
ROLES = frozenset({"user", "assistant", "system"})  # system mid-list: folded into a user turn
SAMPLING_KEYS = {
    "max_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "stop_sequences": "stop",
}


def session_key(headers: Mapping[str, str]) -> str | None:
    """The API key: `Authorization: Bearer` (ANTHROPIC_AUTH_TOKEN) first, then `x-api-key`."""
    return bearer(headers) or (headers.get("X-Api-Key") or headers.get("x-api-key") or "").strip() or None


def check_body(
    body: Mapping[str, Any], checked: int = 0, *, vision: bool = False, strings_checked: bool = False
) -> None:
    """A `FieldError` naming the first malformed field (`body_checks`); the first `checked` messages
    passed in an earlier body of the session (`Known`). `vision`: image blocks are read (`media`)."""
    check.common(body, "messages", checked, strings_checked=strings_checked)
    check.integer(body, "max_tokens", 1, check.MAX_TOKENS_CAP)
    check.number(body, "temperature", 0, 1)
    check.number(body, "top_p", 0, 1, open_low=True)
    check.top_k(body)
    check.stop_strings(body, "stop_sequences")
    check.text_parts(body.get("system"), "system", {"text"})
    refuse_media(body.get("system"), "system")
    messages = body.get("messages")
    check.expect(messages, "messages", "array")
    if not messages:
        raise FieldError("messages", "at least one message is required")
    for i in range(checked, len(messages)):
        m = messages[i]
        check.expect(m, f"messages[{i}]", "object")
        check.role(m.get("role"), f"messages[{i}].role", ROLES)
        check_content(m.get("content"), f"messages[{i}].content")
        refuse_media(m.get("content"), f"messages[{i}].content", vision=vision)
    for i, t in enumerate(body.get("tools") or []):
        check.expect(t, f"tools[{i}]", "object")
        check.nonempty_str(t.get("name"), f"tools[{i}].name")
        check.optional(t, "description", "string", path=f"tools[{i}].")
        check.json_schema(t.get("input_schema"), f"tools[{i}].input_schema")


def check_content(content: Any, path: str) -> None:
    """A string, or blocks whose known types carry their fields (text, thinking, tool_use, tool_result)."""
    check.expect(content, path, "string", "array")
    for i, b in enumerate(content if isinstance(content, list) else []):
        where = f"{path}[{i}]"
        check.block(b, where)
        if b["type"] == "text":
            check.expect(b.get("text"), f"{where}.text", "string")
        elif b["type"] == "thinking":
            check.expect(b.get("thinking"), f"{where}.thinking", "string")
        elif b["type"] == "tool_use":
            check.nonempty_str(b.get("name"), f"{where}.name")
            check.expect(b.get("input"), f"{where}.input", "object")
        elif b["type"] == "tool_result":
            check.text_parts(b.get("content"), f"{where}.content", {"text"})


def parse_request(
    body: dict[str, Any],
    headers: Mapping[str, str],
    session_id: str | None = None,
    known: Known | None = None,
    *,
    vision: bool = False,
    strings_checked: bool = False,
) -> ChatRequest:
    """`known`: what an earlier body made of this one's first messages (the same objects): only the
    messages after them are checked and translated. A system message mid-list folds into an
    earlier user message, so such a body is translated whole (and nothing of it is kept).
    `vision`: the model reads `image` blocks. `strings_checked`: as in `openai_chat.parse_request`."""
    check_body(body, known.count if known else 0, vision=vision, strings_checked=strings_checked)
    raw = body["messages"]
    start = known.count if known else 0
    folds = any(isinstance(m, dict) and m.get("role") == "system" for m in raw[max(start, 1) :])
    if folds:
        body = copy.deepcopy(body)
        fold_mid_list_system(body)
        history, known = translate_history(body["messages"]), None
    else:
        history = known.messages + translate_history(raw[start:]) if known else translate_history(raw)
        known = Known(len(raw), history)
    sampling = {dst: body[src] for src, dst in SAMPLING_KEYS.items() if body.get(src) is not None}
    tools = tools_to_chat_tools(body.get("tools"))
    choice = anthropic_choice(body, names(tools))
    return ChatRequest(
        session_id=session_id or header_session(headers) or session_key(headers) or "default",
        messages=system_messages(body.get("system")) + history,
        tools=offered(tools, choice),
        sampling=sampling,
        stream=want_stream(body, headers),
        model=str(body.get("model") or "slime-actor"),
        tool_choice=choice,
        raw=body,
        known=known,
    )


def translate_messages(msgs: list[dict], system: Any) -> list[dict]:
    return system_messages(system) + translate_history(msgs)


def system_messages(system: Any) -> list[dict]:
    return [{"role": "system", "content": flatten_content(system)}] if system else []


def translate_history(msgs: list[dict]) -> list[dict]:
    """The messages (no system prompt): each translated on its own, so a known prefix stays valid."""
    out: list[dict] = []
    for m in msgs:
        if not isinstance(m, dict):
            continue
        role, content = m.get("role"), m.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": flatten_content(content)}]
        if role == "user" and has_images(blocks):  # the text and images of a turn stay one message
            out.extend(_user_block(b) for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result")
            out.append(
                {
                    "role": "user",
                    "content": template_content(
                        [b for b in blocks if not (isinstance(b, dict) and b.get("type") == "tool_result")]
                    ),
                }
            )
        elif role == "user":
            out.extend(_user_block(b) for b in blocks)
        elif role == "assistant":
            out.append(_assistant(blocks))
        elif role == "system":
            out.append({"role": "system", "content": flatten_content(content)})
    return out


def _user_block(b: Any) -> dict:
    if isinstance(b, dict) and b.get("type") == "tool_result":
        return {"role": "tool", "content": template_content(b.get("content"))}
    if isinstance(b, dict) and b.get("type") == "text":
        return {"role": "user", "content": b.get("text", "")}
    return {"role": "user", "content": flatten_content([b])}  # a block of another type: its text, never its repr


def _assistant(blocks: list) -> dict:
    texts, thinking, calls = [], [], []
    for b in blocks:
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            texts.append(b.get("text", ""))
        elif kind == "thinking":
            thinking.append(b.get("thinking", ""))
        elif kind == "tool_use":
            calls.append(tool_call_dict(b.get("name", "tool"), b.get("input")))
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        msg["reasoning_content"] = "".join(thinking)
    if calls:
        msg["tool_calls"] = calls
    return msg


def tools_to_chat_tools(tools: list[dict] | None) -> list[dict] | None:
    out = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t.get("input_schema") or t.get("parameters") or {"type": "object", "properties": {}},
            },
        }
        for t in tools or []
        if isinstance(t, dict) and "name" in t
    ]
    return out or None


def fold_mid_list_system(body: dict) -> bool:
    """Move each system message after the first position into the previous user message (else the
    next one) as a `<system-reminder>` text block; True when anything moved."""
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        return False
    folded = False
    for i in [i for i, m in enumerate(msgs) if i > 0 and isinstance(m, dict) and m.get("role") == "system"]:
        block = {"type": "text", "text": REMINDER_OPEN + flatten_content(msgs[i].get("content")) + REMINDER_CLOSE}
        before = [m for m in msgs[:i][::-1] if isinstance(m, dict) and m.get("role") == "user"]
        after = [m for m in msgs[i + 1 :] if isinstance(m, dict) and m.get("role") == "user"]
        if before:
            _blocks(before[0]).append(block)
        elif after:
            _blocks(after[0]).insert(0, block)
        else:
            msgs[i] = {"role": "user", "content": [block]}
            folded = True
            continue
        msgs[i] = None
        folded = True
    body["messages"] = [m for m in msgs if m is not None]
    return folded


def _blocks(msg: dict) -> list:
    if not isinstance(msg.get("content"), list):
        c = msg.get("content")
        msg["content"] = [{"type": "text", "text": c if isinstance(c, str) else ""}]
    return msg["content"]


def reply_blocks(reply: Reply) -> list[dict]:
    blocks: list[dict] = []
    if reply.reasoning:
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
    if reply.text:
        blocks.append({"type": "text", "text": reply.text})
    blocks += [
        {"type": "tool_use", "id": new_id("toolu_"), "name": u.name, "input": u.arguments} for u in reply.tool_uses
    ]
    return blocks or [{"type": "text", "text": ""}]


def stop_fields(reply: Reply) -> dict[str, Any]:
    """`stop_reason`, and `stop_sequence` when one of the client's `stop_sequences` ended the turn."""
    if reply.stop_sequence is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": reply.stop_sequence}
    return {"stop_reason": STOP_REASON[reply.finish_reason], "stop_sequence": None}


def _message(reply: Reply, request: ChatRequest, content: list[dict], stop: dict[str, Any], output_tokens: int) -> dict:
    return {
        "id": new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": content,
        **stop,
        "usage": {"input_tokens": reply.usage.input_tokens, "output_tokens": output_tokens},
    }


def render_reply(reply: Reply, request: ChatRequest) -> dict:
    return _message(reply, request, reply_blocks(reply), stop_fields(reply), reply.usage.output_tokens)


def render_stream(reply: Reply, request: ChatRequest) -> Iterator[str]:
    """message_start, then start/delta/stop per block, message_delta, message_stop."""
    unset = {"stop_reason": None, "stop_sequence": None}
    yield sse({"type": "message_start", "message": _message(reply, request, [], unset, 0)}, "message_start")
    for i, block in enumerate(reply_blocks(reply)):
        if block["type"] == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        elif block["type"] == "text":
            start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
        yield sse({"type": "content_block_start", "index": i, "content_block": start}, "content_block_start")
        yield sse({"type": "content_block_delta", "index": i, "delta": delta}, "content_block_delta")
        yield sse({"type": "content_block_stop", "index": i}, "content_block_stop")
    usage = {"input_tokens": reply.usage.input_tokens, "output_tokens": reply.usage.output_tokens}
    yield sse({"type": "message_delta", "delta": stop_fields(reply), "usage": usage}, "message_delta")
    yield sse({"type": "message_stop"}, "message_stop")


def render_error(err: TurnRefused) -> dict:
    """Anthropic's error body; an over-long prompt reads "prompt is too long: ...", as Anthropic's does."""
    return {"type": "error", "error": {"type": err.kind, "message": str(err)}}
