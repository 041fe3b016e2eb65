"""Parse a request body once, and only the part an earlier body of its session did not already hold.

An agent sends its whole history every turn: by turn 64 with 4 kB tool results the body is ~270 kB
of JSON, of which only the last two messages are new. `BodyPrefixes.parse` keeps, per protocol,
the last few bodies of a session as text with the end offset of each element of their history
array (`messages`, or Responses' `input`). A body whose text starts with an earlier body's text up
to the end of that body's last history element is read from there on: the keys before the array
and the array's elements up to that point are the earlier parse's objects (same bytes, same
values: a JSON parser's state at an offset depends only on the bytes before it), the rest is
parsed now. Keyed by content, not by position: an edited earlier message changes the bytes, so
the body is parsed whole, as `json.loads` would. Anything unusual (no object, the array repeated,
a BOM, not UTF-8) is parsed by `json.loads` and not kept.

What the protocol made of those elements (checks passed, translation: `Known`) is kept with the
body, so a turn checks and translates only its new messages.
"""

from __future__ import annotations

import dataclasses
import json
import re
from json.decoder import scanstring
from typing import Any

from slime.agent.gateway.errors import BadRequestError
from slime.agent.gateway.protocols.body_checks import plain_text
from slime.agent.gateway.records import Known

KEPT_BODIES = 4  # per session and protocol: a main agent and a few sub-agents each continue their own
_WS = re.compile(r"[ \t\n\r]*")
_WS_CHARS = frozenset(" \t\n\r")
_scan = json.JSONDecoder().scan_once


class _Irregular(Exception):
    """Not the plain shape this reader follows: `json.loads` reads the body instead."""


@dataclasses.dataclass
class ParsedBody:
    """A body as `json.loads` reads it. `known`: what an earlier body of the session made of the
    first `known.count` elements of `body[key]`, which are that body's very objects (None: all new)."""

    body: Any
    key: str
    known: Known | None = None
    text: str = ""
    head: str | None = None  # the text up to the end of the last history element (None: not kept)
    before: dict[str, Any] | None = None  # the keys read before the history array
    protocol: str = ""
    strings_checked: bool = False  # the new part's text showed its strings and nesting sound (`plain_text`)

    @property
    def new_elements(self) -> int:
        items = self.body.get(self.key) if isinstance(self.body, dict) else None
        return len(items) - (self.known.count if self.known else 0) if isinstance(items, list) else 0


class BodyPrefixes:
    """The last bodies of one session, per protocol (`KEPT_BODIES` each), with what was made of them."""

    def __init__(self) -> None:
        self._kept: list[tuple[ParsedBody, Known]] = []

    def parse(self, raw: bytes, key: str, protocol: str) -> ParsedBody:
        """`raw` parsed (a `BadRequestError` when it is not JSON), reusing the longest kept body of
        `protocol` whose history it continues byte for byte."""
        try:
            text = raw.decode("utf-8")
            if text.startswith("\ufeff"):
                raise _Irregular
        except (UnicodeDecodeError, _Irregular):
            return ParsedBody(_loads(raw), key, protocol=protocol)
        best: tuple[ParsedBody, Known] | None = None
        for parsed, known in self._kept:
            if (
                parsed.protocol == protocol
                and text.startswith(parsed.head)
                and (best is None or len(parsed.head) > len(best[0].head))
            ):
                best = parsed, known
        try:
            if best is not None:
                parsed = _resume(text, best[0], best[1])
                # what is new: the elements past the earlier body's (two levels down) and the keys after them
                parsed.strings_checked = plain_text(text[len(best[0].head) :], 2)
            else:
                parsed = _read(text, key, protocol)
                parsed.strings_checked = plain_text(text)
            return parsed
        except (_Irregular, IndexError, StopIteration, ValueError, RecursionError):
            return ParsedBody(_loads(raw), key, protocol=protocol)

    def keep(self, parsed: ParsedBody, known: Known) -> None:
        """Remember `parsed` (its protocol accepted it and made `known` of its history); the body it
        continued is dropped (its text is this one's prefix), the oldest past `KEPT_BODIES` too."""
        if parsed.head is None or known.count != len(parsed.body[parsed.key]):
            return
        self._kept = [
            (p, k) for p, k in self._kept if p.protocol != parsed.protocol or not parsed.text.startswith(p.head)
        ]
        self._kept.append((parsed, known))
        mine = [i for i, (p, _) in enumerate(self._kept) if p.protocol == parsed.protocol]
        if len(mine) > KEPT_BODIES:
            del self._kept[mine[0]]


def _loads(raw: bytes | str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as e:  # UnicodeDecodeError too: the body is not UTF-8
        raise BadRequestError(f"the request body is not JSON: {e}") from None
    except RecursionError:
        raise BadRequestError("the request body is not JSON this server reads: nested too deeply") from None


def _ws(text: str, i: int) -> int:
    """The offset of the first non-whitespace character from `i`: one space (`json.dumps`' separators)
    or none is the common case, read without the regex (the readers below call this only at a
    whitespace character: most offsets have none, in compact JSON all of them)."""
    c = text[i : i + 1]
    if c == " ":
        i += 1
        c = text[i : i + 1]
    return _WS.match(text, i).end() if c in _WS_CHARS else i


def _read(text: str, key: str, protocol: str) -> ParsedBody:
    i = _ws(text, 0)
    if text[i] != "{":
        raise _Irregular
    i = _ws(text, i + 1)
    if text[i] == "}":
        return _finish(text, i + 1, {}, key, protocol, None, None, None)
    return _members(text, i, {}, key, protocol)


def _resume(text: str, earlier: ParsedBody, known: Known) -> ParsedBody:
    """Read `text` from the end of `earlier`'s last history element, which it repeats byte for byte."""
    items = list(earlier.body[earlier.key][: known.count])
    i, ends_at = _array_rest(text, len(earlier.head), items)
    body = dict(earlier.before)
    body[earlier.key] = items
    return _after_value(text, i, body, earlier.key, earlier.protocol, dict(earlier.before), ends_at, known)


def _members(text: str, i: int, body: dict[str, Any], key: str, protocol: str) -> ParsedBody:
    """The object's members from offset `i` (at a key)."""
    while True:
        if text[i] != '"':
            raise _Irregular
        name, i = scanstring(text, i + 1)
        if text[i] in _WS_CHARS:
            i = _ws(text, i)
        if text[i] != ":":
            raise _Irregular
        i += 1
        if text[i] in _WS_CHARS:
            i = _ws(text, i)
        if name == key and text[i] == "[" and key not in body:
            before = dict(body)
            items: list[Any] = []
            i += 1
            if text[i] in _WS_CHARS:
                i = _ws(text, i)
            if text[i] == "]":
                body[name] = items
                return _after_value(text, i + 1, body, key, protocol, None, None, None)
            value, i = _scan(text, i)
            items.append(value)
            i, ends_at = _array_rest(text, i, items)
            body[name] = items
            return _after_value(text, i, body, key, protocol, before, ends_at, None)
        if name == key:  # the history twice, or not an array: nothing to keep
            raise _Irregular
        body[name], i = _scan(text, i)
        if text[i] in _WS_CHARS:
            i = _ws(text, i)
        if text[i] == "}":
            return _finish(text, i + 1, body, key, protocol, None, None, None)
        if text[i] != ",":
            raise _Irregular
        i += 1
        if text[i] in _WS_CHARS:
            i = _ws(text, i)


def _array_rest(text: str, i: int, items: list[Any]) -> tuple[int, int]:
    """Elements after one just read (offset `i` right after it), up to the closing bracket; the
    offset after the bracket and the end offset of the last element."""
    end = i
    while True:
        if text[i] in _WS_CHARS:
            i = _ws(text, i)
        if text[i] == "]":
            return i + 1, end
        if text[i] != ",":
            raise _Irregular
        value, end = _scan(text, _ws(text, i + 1))
        items.append(value)
        i = end


def _after_value(
    text: str,
    i: int,
    body: dict[str, Any],
    key: str,
    protocol: str,
    before: dict[str, Any] | None,
    ends_at: int | None,
    known: Known | None,
) -> ParsedBody:
    """The members after the history array (which must not come again)."""
    if text[i] in _WS_CHARS:
        i = _ws(text, i)
    while text[i] == ",":
        i += 1
        if text[i] in _WS_CHARS:
            i = _ws(text, i)
        if text[i] != '"':
            raise _Irregular
        name, i = scanstring(text, i + 1)
        if name == key:
            raise _Irregular
        if text[i] in _WS_CHARS:
            i = _ws(text, i)
        if text[i] != ":":
            raise _Irregular
        body[name], i = _scan(text, _ws(text, i + 1))
        if text[i] in _WS_CHARS:
            i = _ws(text, i)
    if text[i] != "}":
        raise _Irregular
    return _finish(text, i + 1, body, key, protocol, before, ends_at, known)


def _finish(
    text: str,
    i: int,
    body: dict[str, Any],
    key: str,
    protocol: str,
    before: dict[str, Any] | None,
    ends_at: int | None,
    known: Known | None,
) -> ParsedBody:
    if _ws(text, i) != len(text):
        raise _Irregular
    head = text[:ends_at] if ends_at is not None else None
    return ParsedBody(body, key, known, text, head, before, protocol)
