"""OpenAI Chat Completions (`POST /v1/chat/completions`) <-> chat-template terms. Pure functions.

`developer` becomes `system`, content parts become text, a replayed assistant's tool calls lose
their wire ids and get dict arguments (so they equal the answer the tree recorded), tool messages
lose `tool_call_id`. Replies are `chat.completion` JSON or `chat.completion.chunk` SSE ending in
`[DONE]` (a usage chunk first when `stream_options.include_usage`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

from slime.agent.gateway.errors import FieldError, TurnRefused
from slime.agent.gateway.protocols import body_checks as check
from slime.agent.gateway.protocols.common import (
    bearer,
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
from slime.agent.gateway.records import ChatRequest, Known, Reply

HISTORY = "messages"  # the array holding the conversation, which grows turn by turn (`body_prefix`)
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
SAMPLING_KEYS = {
    "max_completion_tokens": "max_new_tokens",
    "max_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "stop": "stop",
}


def body_session(body: Mapping[str, Any]) -> str | None:
    """`metadata.session_id`, else `user` (slime's body fallbacks)."""
    meta = body.get("metadata")
    if isinstance(meta, dict) and meta.get("session_id"):
        return str(meta["session_id"])
    return str(body["user"]) if body.get("user") else None


def request_session(headers: Mapping[str, str], body: Mapping[str, Any], session_id: str | None = None) -> str:
    return session_id or header_session(headers) or bearer(headers) or body_session(body) or "default"


def sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for src, dst in SAMPLING_KEYS.items():
        if body.get(src) is not None and dst not in out:  # max_completion_tokens wins over max_tokens
            out[dst] = body[src]
    return out


def check_body(
    body: Mapping[str, Any], checked: int = 0, *, vision: bool = False, strings_checked: bool = False
) -> None:
    """A `FieldError` naming the first malformed field (`body_checks`); the first `checked` messages
    passed in an earlier body of the session (`Known`). `vision`: image parts are read (`media`).
    (Each check of an optional key runs only when the key is there: an absent key passes them all.)"""
    check.common(body, "messages", checked, strings_checked=strings_checked)
    if "stream_options" in body:
        check.optional(body, "stream_options", "object")
    if "user" in body:
        check.optional(body, "user", "string")
    if not _RANGED.isdisjoint(body.keys()):
        sampling_ranges(body)
    messages = body.get("messages")
    if type(messages) is not list:
        check.expect(messages, "messages", "array")
    if not messages:
        raise FieldError("messages", "at least one message is required")
    for i in range(checked, len(messages)):
        check_message(messages[i], f"messages[{i}]")
        refuse_media(messages[i].get("content"), f"messages[{i}].content", vision=vision)
    for i, t in enumerate(body.get("tools") or []):
        check_tool(t, f"tools[{i}]")


_RANGED = frozenset(
    {"max_completion_tokens", "max_tokens", "temperature", "top_p", "top_k", "stop", "n", "logprobs", "top_logprobs"}
)
_PLAIN_KEYS = frozenset({"role", "content", "name"})


def _plain_message(m: dict[str, Any]) -> bool:
    """A message of a known role, string (or null) content and no other key `check_message` reads:
    what it passes (anything else takes the checks' way, and their refusal)."""
    role, content = m.get("role"), m.get("content")
    return (
        type(role) is str
        and role in ROLES
        and (content is None or type(content) is str)
        and _PLAIN_KEYS.issuperset(m.keys())
    )


def sampling_ranges(body: Mapping[str, Any]) -> None:
    """In this order; each check only where its key is (an absent key passes every one of them)."""
    for key in ("max_completion_tokens", "max_tokens"):
        if key in body:
            check.integer(body, key, 1, check.MAX_TOKENS_CAP)
    if "temperature" in body:
        check.number(body, "temperature", 0, 2)
    if "top_p" in body:
        check.number(body, "top_p", 0, 1, open_low=True)
    if "top_k" in body:
        check.top_k(body)
    if "stop" in body:
        check.stop_strings(body, "stop")
    if "n" in body:
        one_choice(body)
    if "logprobs" in body:
        check.optional(body, "logprobs", "boolean")
    if "top_logprobs" in body and top_logprobs(body) and body.get("logprobs") is not True:
        raise FieldError("top_logprobs", "needs logprobs: true")


def one_choice(body: Mapping[str, Any]) -> None:
    """`n` > 1 is refused: an agent acts on one answer, so the other n-1 would be sampled answers no
    conversation continues (trained as dead-end branches or not at all). Several samples of one task
    are several sessions (`--n-samples-per-prompt`), each with its own reward."""
    check.integer(body, "n", 1, 128)
    if (body.get("n") or 1) > 1:
        raise FieldError(
            "n",
            f"must be 1 (got {body['n']}): each agent session samples one answer per turn; "
            "draw several samples as several sessions (--n-samples-per-prompt)",
        )


def check_message(m: Any, path: str) -> None:
    """The message's shape; its media blocks are `refuse_media`'s (read or refused by the model's kind)."""
    if type(m) is dict and _plain_message(m):  # (what the checks below pass, at a glance)
        return
    check.expect(m, path, "object")
    check.role(m.get("role"), f"{path}.role", ROLES)
    check.text_parts(m.get("content"), f"{path}.content", TEXT_PARTS)
    check.optional(m, "reasoning_content", "string", path=f"{path}.")
    check.optional(m, "tool_calls", "array", path=f"{path}.")
    for j, call in enumerate(m.get("tool_calls") or []):
        where = f"{path}.tool_calls[{j}]"
        check.expect(call, where, "object")
        check.expect(call.get("function"), f"{where}.function", "object")
        check.nonempty_str(call["function"].get("name"), f"{where}.function.name")
        check.optional(call["function"], "arguments", "string", "object", path=f"{where}.function.")


def check_tool(t: Any, path: str) -> None:
    check.expect(t, path, "object")
    check.optional(t, "type", "string", path=f"{path}.")
    if t.get("type", "function") != "function":
        return  # another kind of tool (`custom`): not offered to the template, as before
    check.expect(t.get("function"), f"{path}.function", "object")
    check.nonempty_str(t["function"].get("name"), f"{path}.function.name")
    check.optional(t["function"], "description", "string", path=f"{path}.function.")
    check.json_schema(t["function"].get("parameters"), f"{path}.function.parameters")


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
    messages after them are checked and translated. `vision`: the model reads `image_url` parts.
    `strings_checked`: the body's own text showed its strings and nesting sound (`body_checks.plain_text`)."""
    check_body(body, known.count if known else 0, vision=vision, strings_checked=strings_checked)
    tools = chat_tools(body.get("tools"))
    choice = openai_choice(body, names(tools))
    raw = body["messages"]
    messages = known.messages + translate_messages(raw[known.count :]) if known else translate_messages(raw)
    return ChatRequest(
        session_id=request_session(headers, body, session_id),
        messages=messages,
        tools=offered(tools, choice),
        sampling=sampling(body),
        stream=want_stream(body, headers),
        model=str(body.get("model") or "slime-actor"),
        tool_choice=choice,
        logprobs=body.get("logprobs") is True,
        top_logprobs=top_logprobs(body) if "top_logprobs" in body else 0,
        raw=body,
        known=Known(len(raw), messages),
    )


def translate_messages(msgs: list[dict]) -> list[dict]:
    out: list[dict] = []
    for m in msgs:
        if not isinstance(m, dict):
            continue
        role = "system" if m.get("role") == "developer" else m.get("role")
        msg: dict[str, Any] = {"role": role, "content": template_content(m.get("content"))}
        if role == "assistant":
            if m.get("reasoning_content"):
                msg["reasoning_content"] = m["reasoning_content"]
            calls = [
                tool_call_dict(
                    (c.get("function") or {}).get("name", "tool"),
                    parse_arguments((c.get("function") or {}).get("arguments")),
                )
                for c in m.get("tool_calls") or []
                if isinstance(c, dict)
            ]
            if calls:
                msg["tool_calls"] = calls
        out.append(msg)
    return out


def chat_tools(tools: list[dict] | None) -> list[dict] | None:
    out = [
        {"type": "function", "function": t["function"]}
        for t in tools or []
        if isinstance(t, dict) and isinstance(t.get("function"), dict)
    ]
    return out or None


def _wire_calls(reply: Reply) -> list[dict]:
    return [
        {
            "id": new_id("call_"),
            "type": "function",
            "function": {"name": u.name, "arguments": json.dumps(u.arguments, ensure_ascii=False)},
        }
        for u in reply.tool_uses
    ]


def _message(reply: Reply) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": reply.text or (None if reply.tool_uses else "")}
    if reply.reasoning:
        msg["reasoning_content"] = reply.reasoning
    if reply.tool_uses:
        msg["tool_calls"] = _wire_calls(reply)
    return msg


def _usage(reply: Reply) -> dict[str, int]:
    u = reply.usage
    return {
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.input_tokens + u.output_tokens,
    }


def render_reply(reply: Reply, request: ChatRequest) -> dict:
    return {
        "id": new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": [
            {"index": 0, "message": _message(reply), "finish_reason": reply.finish_reason, "logprobs": _logprobs(reply)}
        ],
        "usage": _usage(reply),
    }


def _logprobs(reply: Reply) -> dict[str, Any] | None:
    return None if reply.logprobs is None else {"content": logprob_entries(reply), "refusal": None}


def render_stream(reply: Reply, request: ChatRequest) -> Iterator[str]:
    head = {
        "id": new_id("chatcmpl-"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": request.model,
    }

    def chunk(delta: dict, finish: str | None = None, logprobs: dict | None = None) -> str:
        return sse({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]})

    yield chunk({"role": "assistant"}, logprobs=_logprobs(reply))  # every sampled token's, in the first chunk
    if reply.reasoning:
        yield chunk({"reasoning_content": reply.reasoning})
    if reply.text:
        yield chunk({"content": reply.text})
    for i, call in enumerate(_wire_calls(reply)):
        yield chunk({"tool_calls": [{"index": i, **call}]})
    yield chunk({}, reply.finish_reason)
    if (request.raw.get("stream_options") or {}).get("include_usage"):
        yield sse({**head, "choices": [], "usage": _usage(reply)})
    yield sse("[DONE]")


def render_error(err: TurnRefused) -> dict:
    return {
        "error": {
            "message": str(err),
            "type": err.kind,
            "param": getattr(err, "param", None),
            "code": getattr(err, "code", None),
        }
    }
