"""`EncodedIds`: a list of token ids that carries its own JSON text, so a request body holding a
long prompt is written without encoding every id again.

An agent session's prompt grows by a delta each turn; encoding its ~70k ids to JSON per turn was
most of a turn's CPU by turn 64. The text is built the way the ids are: the previous prompt's text,
then the new ids' (`extended`). `dumps` writes a body with an `EncodedIds` under `input_ids` by
splicing that text in; any other body is `json.dumps`.
"""

from __future__ import annotations

import json
from typing import Any


def ids_text(ids: list[int]) -> str:
    """The ids as JSON array items, no brackets."""
    return json.dumps(ids)[1:-1]


class EncodedIds(list):
    """Plain ints (already checked by whoever built them) and `text`, their JSON array items."""

    __slots__ = ("text",)

    def __init__(self, ids: list[int], text: str | None = None) -> None:
        super().__init__(ids)
        self.text = ids_text(self) if text is None else text

    def extended(self, *parts: list[int]) -> EncodedIds:
        """These ids followed by `parts`, encoding only the parts."""
        out = EncodedIds.__new__(EncodedIds)
        list.__init__(out, self)
        texts = [self.text] if self.text else []
        for p in parts:
            if p:
                out += p
                texts.append(ids_text(p))
        out.text = ", ".join(texts)
        return out


def dumps(body: Any) -> str:
    """`json.dumps(body)`, with an `EncodedIds` under `input_ids` spliced in as its own text."""
    ids = body.get("input_ids") if isinstance(body, dict) else None
    if not isinstance(ids, EncodedIds):
        return json.dumps(body)
    rest = json.dumps({k: v for k, v in body.items() if k != "input_ids"})
    return f'{{"input_ids": [{ids.text}]' + (", " + rest[1:] if rest != "{}" else "}")
