"""What the three wire protocols share: content flattening, session keys, SSE framing, ids."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping
from typing import Any

from slime.agent.gateway.protocols import body_checks as check

SESSION_HEADER = "X-Session-Id"


def flatten_content(c: Any) -> str:
    """A wire content value (string, or a list of Anthropic / OpenAI blocks) as template text (media
    blocks never get here: `media.refuse_media` refused them)."""
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if not isinstance(c, list):
        return str(c)
    parts: list[str] = []
    for b in c:
        if not isinstance(b, dict):
            parts.append(str(b))
        elif b.get("type") in {"text", "input_text", "output_text"}:
            parts.append(b.get("text", ""))
        elif "content" in b:
            parts.append(flatten_content(b.get("content")))
        elif "text" in b:
            parts.append(str(b.get("text") or ""))
    return "\n".join(p for p in parts if p)


def bearer(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("Authorization") or headers.get("authorization") or ""
    return (auth[7:].strip() or None) if auth.lower().startswith("bearer ") else None


def header_session(headers: Mapping[str, str]) -> str | None:
    return (headers.get(SESSION_HEADER) or headers.get(SESSION_HEADER.lower()) or "").strip() or None


def sse(data: Any, event: str | None = None) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"


_IDS = random.Random()  # seeded from the OS; its own, so a `random.seed` elsewhere never repeats these ids
os.register_at_fork(after_in_child=_IDS.seed)  # (a forked child draws ids of its own, as `random`'s does)


def new_id(prefix: str) -> str:
    """A response or tool-call id: `prefix` and 24 random hex digits. Unique, not secret (it names an
    answer to the client that got it), so drawn without a system call per id (`secrets` makes one)."""
    return f"{prefix}{_IDS.getrandbits(96):024x}"


def parse_arguments(arguments: Any) -> Any:
    """Tool-call arguments as a dict: clients send them as a JSON string (OpenAI) or a dict."""
    if not isinstance(arguments, str):
        return arguments or {}
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return {"_raw_arguments": arguments}


def tool_call_dict(name: str, arguments: Any) -> dict[str, Any]:
    """slime's canonical recorded form: arguments a dict, no wire id, so a replay compares equal."""
    return {"type": "function", "function": {"name": name, "arguments": arguments or {}}}


def want_stream(body: Mapping[str, Any], headers: Mapping[str, str]) -> bool:
    return body.get("stream") is True or "text/event-stream" in (headers.get("Accept") or headers.get("accept") or "")


def logprob_entries(reply: Any) -> list[dict[str, Any]]:
    """OpenAI's per-token log-prob objects for a reply's sampled tokens, with the engine's most likely
    alternatives when asked (`top_logprobs`); every number is the engine's own."""

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    return [{**entry(t.token, t.logprob), "top_logprobs": [entry(*alt) for alt in t.top]} for t in reply.logprobs or []]


def top_logprobs(body: Mapping[str, Any]) -> int:
    """`top_logprobs`: 0 to 20 alternatives per position (OpenAI's range), answered by the engine
    (`top_logprobs_num`)."""
    check.integer(body, "top_logprobs", 0, 20)
    return body.get("top_logprobs") or 0
