"""`EncodedIds`: token ids that carry their own JSON text and share the prompt they extend, so a turn
of a long session neither copies nor encodes its history again.

An agent session's prompt grows by a delta each turn: the previous prompt, the ids sampled, the
chat template's ids for the new messages. Encoding its ~70k ids to JSON per turn was most of a turn's
CPU by turn 64; once the text was kept, copying the ~70k ids themselves was (each id an object to
touch). So a prompt is its parts -- the previous prompt's parts, then the new ones -- each a list
never changed again, with each part's JSON array items as ASCII bytes: `extended` costs the delta
only, and `body_pieces` hands the parts' text to the connection, which copies it once into the
request it writes. It is read as a sequence (`len`, index, slice, iteration, `==` with a list);
`list(ids)` makes a plain list where one is needed.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Iterator, Sequence
from typing import Any


def ids_text(ids: list[int]) -> str:
    """The ids as JSON array items, no brackets."""
    return json.dumps(ids)[1:-1]


class EncodedIds(Sequence):
    """Plain ints (already checked by whoever built them) in `parts` (lists, none empty, never changed: each
    a copy made here), `ends` (each part's end), and `runs` (each part's JSON array items). Immutable: what
    reaches the engine is always what the sequence holds."""

    __slots__ = ("parts", "ends", "runs")

    def __init__(self, ids: Sequence[int], text: str | None = None) -> None:
        part = list(ids)
        self.parts: tuple[list[int], ...] = (part,) if part else ()
        self.ends: tuple[int, ...] = (len(part),) if part else ()
        text = ids_text(part) if text is None else text
        self.runs: tuple[bytes, ...] = (text.encode(),) if part else ()

    def extended(self, *parts: Sequence[int]) -> EncodedIds:
        """These ids followed by `parts`: shares this one's parts, and an `EncodedIds` part's own, with their
        text; copies and encodes only the other new ones."""
        new_parts, runs, ends, end = list(self.parts), list(self.runs), list(self.ends), len(self)
        for p in parts:
            if isinstance(p, EncodedIds):
                new_parts += p.parts
                runs += p.runs
                ends += (end + e for e in p.ends)
                end += len(p)
            elif len(p):
                part = list(p)
                new_parts.append(part)
                runs.append(ids_text(part).encode())
                end += len(part)
                ends.append(end)
        out = EncodedIds.__new__(EncodedIds)
        out.parts, out.runs, out.ends = tuple(new_parts), tuple(runs), tuple(ends)
        return out

    @property
    def text(self) -> str:
        """The JSON array items, no brackets."""
        return b", ".join(self.runs).decode()

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __iter__(self) -> Iterator[int]:
        return itertools.chain.from_iterable(self.parts)

    def __getitem__(self, index: int | slice) -> Any:
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                return list(self)[index]
            return self._range(start, stop)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("EncodedIds index out of range")
        k = bisect.bisect_right(self.ends, i)
        return self.parts[k][i - (self.ends[k - 1] if k else 0)]

    def _range(self, start: int, stop: int) -> list[int]:
        """The ids [start, stop) as a plain list, from the parts they lie in only."""
        out: list[int] = []
        k = bisect.bisect_right(self.ends, start)
        while start < stop and k < len(self.parts):
            begin = self.ends[k - 1] if k else 0
            out += self.parts[k][start - begin : min(stop, self.ends[k]) - begin]
            start, k = self.ends[k], k + 1
        return out

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (EncodedIds, list)):
            return len(other) == len(self) and list(other) == list(self)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  (a list's equality -- a tuple is not equal -- and hashability)

    def __add__(self, other: Sequence[int]) -> list[int]:
        return [*self, *other]

    def __radd__(self, other: Sequence[int]) -> list[int]:
        return [*other, *self]

    def __repr__(self) -> str:
        return f"EncodedIds({list(self)!r})"

    def __reduce__(self) -> tuple:
        return (_rebuilt, (self.parts, self.runs))


def _rebuilt(parts: tuple[list[int], ...], runs: tuple[bytes, ...]) -> EncodedIds:
    out = EncodedIds.__new__(EncodedIds)
    out.parts, out.runs = parts, runs
    out.ends = tuple(itertools.accumulate(len(p) for p in parts))
    return out


def body_pieces(body: Any) -> list[bytes]:
    """`json.dumps(body)` as bytes, in pieces to be written one after another: an `EncodedIds` under
    `input_ids` as its parts' own text, uncopied."""
    ids = body.get("input_ids") if isinstance(body, dict) else None
    if not isinstance(ids, EncodedIds):
        return [json.dumps(body).encode()]
    rest = json.dumps({k: v for k, v in body.items() if k != "input_ids"})
    pieces = [b'{"input_ids": [']
    for run in ids.runs:
        pieces += (run, b", ")
    if ids.runs:
        pieces.pop()
    pieces.append(b"]" + (b", " + rest[1:].encode() if rest != "{}" else b"}"))
    return pieces
