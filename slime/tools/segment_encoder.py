"""`SegmentEncoder`: a fast tokenizer's `encode(text, add_special_tokens=False)`, keeping the ids of the long
pieces of text it has met, so a prompt's system message and tool schemas are encoded once per run.

Why: the Rust tokenizer takes ~1.6 us per token. An agent's first prompt is a long system message and
tool schemas shared by every task of a run, then the task's own few lines: a 1,160-token first prompt cost
the gateway ~1.9 ms to encode, again for each task, and a conversation rendered whole again (an edit, a
compaction) re-encodes every tool result it holds.

Why this is exact: the library cuts the text at its added tokens (`<|im_start|>`, `<|im_end|>`, `<think>`,
...) before anything else, then normalizes, pre-tokenizes and encodes each piece between them on its own;
the whole text's ids are the pieces' ids and the added tokens' ids, in order. So a long piece is looked up
(or encoded alone and kept), and the text around long pieces is encoded as it stands, in runs that begin
and end where the library cuts. That holds only where the cut is where the library makes it: every added
token matched on the raw text (not `normalized`) and without `lstrip`/`rstrip`/`single_word` (which move
the cut into the whitespace around it), special tokens not encoded as text (`encode_special_tokens`),
and no pre-tokenizer that treats the text's first piece apart (Metaspace's `prepend_scheme="first"`).
`SegmentEncoder.of` returns None for any other tokenizer, and for one whose encoding of its probes differs
from the library's own; the caller then encodes whole.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

from slime.tools.word_encoder import WordEncoder
from slime.utils.encoded_ids import EncodedIds, ids_text

MIN_KEPT_CHARS = 256  # a shorter piece costs about as much to encode again as to look up
KEPT_CHARS = 1_000_000  # the kept pieces' text, at most (least recently used dropped first): ~12 MB with their ids
# pre-tokenizers that treat every piece alike, wherever it sits in the text
_PIECEWISE = {
    "BertPreTokenizer",
    "ByteLevel",
    "CharDelimiterSplit",
    "Digits",
    "Punctuation",
    "Sequence",
    "Split",
    "UnicodeScripts",
    "Whitespace",
    "WhitespaceSplit",
}


def _piecewise(config: Any) -> bool:
    """Whether a pre-tokenizer's JSON config (and every one it nests) encodes each piece alike."""
    if isinstance(config, list):
        return all(_piecewise(c) for c in config)
    if not isinstance(config, dict):
        return True
    kind = config.get("type")
    if kind == "Metaspace":
        ok = config.get("prepend_scheme", "always") in ("always", "never")
    else:
        ok = kind is None or kind in _PIECEWISE
    return ok and all(_piecewise(v) for v in config.values() if isinstance(v, (dict, list)))


class SegmentEncoder:
    def __init__(
        self, backend: Any, added: dict[str, int], *, kept_chars: int = KEPT_CHARS, min_chars: int = MIN_KEPT_CHARS
    ) -> None:
        self.backend = backend
        self.words = WordEncoder.of(backend)  # a piece met first: plain ASCII (a tool result) word by word
        self.added = added
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)  # changes when tokens are added
        self.cut = re.compile("|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)))
        self.kept_limit, self.min_chars = kept_chars, min_chars
        self._kept: OrderedDict[str, tuple[list[int], str]] = OrderedDict()  # piece -> ids, their JSON items
        self._kept_chars = 0
        self._lock = threading.Lock()

    @classmethod
    def of(cls, backend: Any, **kwargs: Any) -> SegmentEncoder | None:
        """The encoder for a `tokenizers.Tokenizer`, or None where cutting at its added tokens is not exact."""
        try:
            tokens = backend.get_added_tokens_decoder()
            pre = backend.pre_tokenizer
            config = json.loads(pre.__getstate__()) if pre is not None else None
        except Exception:  # noqa: BLE001 - another library version: encode whole
            return None
        if not tokens or not _piecewise(config):
            return None
        if any(t.normalized or t.lstrip or t.rstrip or t.single_word for t in tokens.values()):
            return None
        added = {t.content: i for i, t in tokens.items() if t.content}
        encoder = cls(backend, added, **kwargs)
        return encoder if encoder.agrees() else None

    def agrees(self) -> bool:
        """Whether this encoder gives the library's ids for probes with long pieces first, between added
        tokens, and last, each next to whitespace and text of its own."""
        names = sorted(self.added, key=len)[:3]
        long = " ".join(["Probe text, with numbers 12345 and\ttabs;"] * (self.min_chars // 30 + 1))
        probes = [
            long + names[0] + "\n" + long + " " + names[-1] + long,
            " " + long + "\n" + names[0] + names[-1] + "x" + long + "\n\n",
            names[0] + long + names[0] + "ab" + names[-1] + long + " " + names[0],
        ]
        for text in probes:
            want = self.backend.encode(text, add_special_tokens=False).ids
            self._kept.clear()
            self._kept_chars = 0
            if self.encode(text) != want or self.encode_json(text) != want:  # a miss, then a hit
                return False
        self._kept.clear()
        self._kept_chars = 0
        return True

    def encode(self, text: str) -> list[int]:
        return self._encode(text, None)

    def encode_json(self, text: str) -> EncodedIds:
        """The ids with their JSON text (`EncodedIds`), a kept piece's text kept with its ids: a prompt
        whose system message was met before is written to the engine without encoding its ids again."""
        texts: list[str] = []
        ids = self._encode(text, texts)
        return EncodedIds(ids, ", ".join(t for t in texts if t))

    def _encode(self, text: str, texts: list[str] | None) -> list[int]:
        """The ids of `text`; with `texts`, each part's JSON array items appended to it, in order."""
        b = self.backend
        if b.encode_special_tokens or b.get_vocab_size(with_added_tokens=True) != self.vocab_size:
            ids = b.encode(text, add_special_tokens=False).ids
            if texts is not None:
                texts.append(ids_text(ids))
            return ids
        ids: list[int] = []
        if len(text) < self.min_chars:  # nothing to keep in it
            self._run(text, 0, len(text), ids, texts)
            return ids
        run = 0  # where the text not encoded yet begins (0, or an added token's start)
        piece = 0  # where the current piece begins (0, or an added token's end)
        for m in self.cut.finditer(text):
            if m.start() - piece >= self.min_chars:
                self._run(text, run, piece, ids, texts)
                self._piece(text[piece : m.start()], ids, texts)
                run = m.start()
            piece = m.end()
        if len(text) - piece >= self.min_chars:
            self._run(text, run, piece, ids, texts)
            self._piece(text[piece:], ids, texts)
            run = len(text)
        self._run(text, run, len(text), ids, texts)
        return ids

    def _run(self, text: str, start: int, end: int, ids: list[int], texts: list[str] | None) -> None:
        """The ids of `text[start:end]`, which begins and ends where the library cuts."""
        if start >= end:
            return
        run = text[start:end]
        one = self.added.get(run)
        if one is None and self.words is not None and self.words.takes(run):
            self._words_run(run, ids, texts)
            return
        part = [one] if one is not None else self.backend.encode(run, add_special_tokens=False).ids
        ids += part
        if texts is not None:
            texts.append(ids_text(part))

    def _words_run(self, run: str, ids: list[int], texts: list[str] | None) -> None:
        """Plain ASCII: its pieces word by word (each word's text kept with its ids), the added tokens as they are."""
        at = 0
        for m in self.cut.finditer(run):
            if m.start() > at:
                ids += self.words.encode(run[at : m.start()], texts)
            one = self.added[m.group()]
            ids.append(one)
            if texts is not None:
                texts.append(str(one))
            at = m.end()
        if at < len(run):
            ids += self.words.encode(run[at:], texts)

    def _piece(self, piece: str, ids: list[int], texts: list[str] | None) -> None:
        with self._lock:
            kept = self._kept.get(piece)
            if kept is not None:
                self._kept.move_to_end(piece)
        if kept is None:
            words: list[str] = []
            part = self.words.encode(piece, words) if self.words is not None else None
            if part is not None:
                kept = (part, ", ".join(t for t in words if t))
            else:
                part = self.backend.encode(piece, add_special_tokens=False).ids
                kept = (part, ids_text(part))
            with self._lock:
                if piece not in self._kept:
                    self._kept[piece] = kept
                    self._kept_chars += len(piece)
                    while self._kept_chars > self.kept_limit and self._kept:
                        dropped, _ = self._kept.popitem(last=False)
                        self._kept_chars -= len(dropped)
        ids += kept[0]
        if texts is not None:
            texts.append(kept[1])
