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


def _frozen(self: EncodedIds, *args: Any, **kwargs: Any) -> None:
    raise TypeError(
        "EncodedIds cannot change in place: its JSON text would no longer be its ids (the engine "
        "would get other tokens than the sample records); build another with .extended() or list()"
    )


class EncodedIds(list):
    """Plain ints (already checked by whoever built them) and `text`, their JSON array items. Read-only: a change
    in place would leave `text`, which is what reaches the engine, saying other ids than the list holds."""

    __slots__ = ("text",)

    def __init__(self, ids: list[int], text: str | None = None) -> None:
        list.__init__(self, ids)
        self.text = ids_text(self) if text is None else text

    append = extend = insert = pop = remove = clear = sort = reverse = _frozen
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _frozen

    def extended(self, *parts: list[int]) -> EncodedIds:
        """These ids followed by `parts`, encoding only the parts."""
        out = EncodedIds.__new__(EncodedIds)
        list.__init__(out, self)
        texts = [self.text] if self.text else []
        for p in parts:
            if p:
                list.extend(out, p)
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
