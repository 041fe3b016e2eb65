"""Shape checks of a wire request body, run before it is translated.

A wrong type, an out-of-range number, an unknown role, a content block of the wrong shape or a
string no tokenizer can encode (a lone surrogate) is refused as a `FieldError` naming the field
(`messages[2].content[0].text`), so a malformed body is a 400 in the client's own API format --
never a 500 from deep inside the chat template, and never a turn counted against its session.
Fields this gateway ignores are not checked; unknown content block types pass (a newer client's
blocks are dropped by `flatten_content`, not refused).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from typing import Any

from slime.agent.gateway.errors import FieldError

MAX_TOKENS_CAP = 2**31 - 1  # the engines' int32 bound on max_new_tokens
MAX_DEPTH = 256  # nesting of a body (tool schemas nest; nothing sane nests deeper)
# exact types (bool cannot be subclassed; a subclass of another is named by its class, as before)
_KINDS = {
    type(None): "null",
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
}
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # JSON's only way to write one (\uD800-\uDFFF)


def plain_text(text: str, depth: int = 0) -> bool:
    """Whether the values of a JSON text read from UTF-8 (its strings and keys, `depth` levels down)
    are sure to pass `no_lone_surrogates`: strict UTF-8 decoding refuses surrogates, so a lone one
    can only come from a `\\uD800`-`\\uDFFF` escape, and nothing nests deeper than the text has
    opening brackets. One scan in C for a body's whole walk in Python; False proves nothing (the
    walk decides, naming the path). An escaped backslash before `ud8..` is a false alarm, not a miss."""
    return _SURROGATE_ESCAPE.search(text) is None and depth + text.count("[") + text.count("{") <= MAX_DEPTH


def no_lone_surrogates(value: Any, path: str = "body", depth: int = 0) -> None:
    """Every string (and key) of the body encodes as UTF-8; nesting stays under `MAX_DEPTH`. A body
    that passes is walked once without naming paths (`_plain`); one that does not, again with them."""
    if not _plain(value, depth):
        _named_walk(value, path, depth)


def _plain(value: Any, depth: int) -> bool:
    """Whether `_named_walk` would pass `value` (at `depth`): the same visits, no path built per value."""
    search = _SURROGATE.search
    stack = [(value, depth)]
    pop, push = stack.pop, stack.append
    while stack:
        v, d = pop()
        if d > MAX_DEPTH:
            return False
        if isinstance(v, str):
            if search(v):
                return False
        elif isinstance(v, dict):
            if v and d >= MAX_DEPTH:  # its keys and values sit one level deeper
                return False
            for k, item in v.items():
                if isinstance(k, str) and search(k):
                    return False
                push((item, d + 1))
        elif isinstance(v, list):
            for item in v:
                push((item, d + 1))
    return True


def _named_walk(value: Any, path: str = "body", depth: int = 0) -> None:
    """The walk that names the first failing value's path (`no_lone_surrogates`)."""
    if depth > MAX_DEPTH:
        raise FieldError(path, f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        if _SURROGATE.search(value):
            raise FieldError(path, "contains a lone UTF-16 surrogate, which is not valid UTF-8 text")
    elif isinstance(value, dict):
        for k, v in value.items():
            _named_walk(k, path, depth + 1)
            _named_walk(v, f"{path}.{k}" if path != "body" else k, depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _named_walk(v, f"{path}[{i}]", depth + 1)


def strings_past(body: Mapping[str, Any], history: str, checked: int) -> None:
    """`no_lone_surrogates(body)` (same order, same paths) over all but the first `checked` elements
    of `body[history]`."""
    for k, v in body.items():
        no_lone_surrogates(k, "body", 1)
        if k == history:
            for i in range(checked, len(v)):
                no_lone_surrogates(v[i], f"{k}[{i}]", 2)
        else:
            no_lone_surrogates(v, k, 1)


def kind(value: Any) -> str:
    """The JSON name of a value's type, for error messages."""
    return _KINDS.get(type(value)) or type(value).__name__


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


def expect(value: Any, path: str, *types: str) -> None:
    """`value` is one of the JSON types named (`"string"`, `"array"`, `"null"`, ...)."""
    if kind(value) not in types:
        raise FieldError(path, f"must be {' or '.join(types)}, got {kind(value)}")


def optional(body: Mapping[str, Any], key: str, *types: str, path: str = "") -> None:
    """`body[key]`, when there, is null or one of `types` (`expect`'s refusal; the path built only for it)."""
    if key in body and body[key] is not None and kind(body[key]) not in types:
        expect(body[key], f"{path}{key}", "null", *types)


def nonempty_str(value: Any, path: str) -> None:
    expect(value, path, "string")
    if not value:
        raise FieldError(path, "must not be empty")


def integer(body: Mapping[str, Any], key: str, lo: int, hi: int) -> None:
    value = body.get(key)
    if value is None:
        return
    if not is_int(value) or not lo <= value <= hi:
        raise FieldError(key, f"must be an integer in [{lo}, {hi}], got {value!r:.60}")


def number(body: Mapping[str, Any], key: str, lo: float, hi: float, *, open_low: bool = False) -> None:
    value = body.get(key)
    if value is None:
        return
    low_ok = is_number(value) and (value > lo if open_low else value >= lo)
    if not low_ok or value > hi:
        bracket = "(" if open_low else "["
        raise FieldError(key, f"must be a finite number in {bracket}{lo}, {hi}], got {value!r:.60}")


def top_k(body: Mapping[str, Any]) -> None:
    value = body.get("top_k")
    if value is not None and (not is_int(value) or not (value == -1 or 1 <= value <= MAX_TOKENS_CAP)):
        raise FieldError("top_k", f"must be -1 (off) or a positive integer, got {value!r:.60}")


def stop_strings(body: Mapping[str, Any], key: str) -> None:
    value = body.get(key)
    if value is None or isinstance(value, str):
        return
    expect(value, key, "string", "array")
    for i, s in enumerate(value):
        expect(s, f"{key}[{i}]", "string")


def role(value: Any, path: str, allowed: Collection[str]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise FieldError(path, f"must be one of {', '.join(sorted(allowed))}; got {value!r:.60}")


def text_parts(content: Any, path: str, text_types: Collection[str]) -> None:
    """A content value: null, a string, or a list of typed parts whose text parts carry a string."""
    expect(content, path, "null", "string", "array")
    for i, part in enumerate(content if isinstance(content, list) else []):
        block(part, f"{path}[{i}]")
        if part["type"] in text_types:
            expect(part.get("text"), f"{path}[{i}].text", "string")


def block(value: Any, path: str) -> None:
    """A typed part: an object with a string `type`."""
    expect(value, path, "object")
    expect(value.get("type"), f"{path}.type", "string")


def json_schema(value: Any, path: str) -> None:
    """A tool's parameter schema: absent/null or an object (JSON Schema is an object)."""
    expect(value, path, "null", "object")


def common(body: Mapping[str, Any], history: str = "", checked: int = 0, *, strings_checked: bool = False) -> None:
    """Checks every protocol shares: the body's strings, `model`, `stream`, `metadata`. The first
    `checked` elements of `body[history]` passed these checks in an earlier body (`Known`);
    `strings_checked`: the text of the rest showed its strings and nesting sound (`plain_text`)."""
    if checked and not strings_checked:
        strings_past(body, history, checked)
    elif not strings_checked:
        no_lone_surrogates(body)
    if "model" in body:  # (each check only where its key is: an absent key passes it)
        optional(body, "model", "string")
    if "stream" in body:
        optional(body, "stream", "boolean")
    if "metadata" in body:
        optional(body, "metadata", "object")
    if "tools" in body:
        optional(body, "tools", "array")
