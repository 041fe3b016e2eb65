"""`WordEncoder`: a byte-level BPE tokenizer's ids for plain ASCII text, split into words by the tokenizer's own
pattern and each word's ids kept, so a 4 kB tool result is encoded in under half the library's CPU.

Why: the Rust tokenizer spends ~2 us a token on a tool result, most of it in its pre-tokenizer's regex
(Oniguruma); a turn's gateway CPU with a 4 kB tool result was mostly that. Code, logs and test output are plain
ASCII and their words repeat: the same pattern run by Python's `re` (its Unicode classes written out for ASCII,
in half the `regex` module's time), and each distinct word's BPE ids asked of the library's own model once,
give the library's ids.

Exact only where that is the whole pipeline, so only for: a normalizer that leaves ASCII alone (NFC, NFD, NFKC,
NFKD or none), a pre-tokenizer that is the library's byte-level one (`ByteLevel` with its GPT-2 pattern, or a
`Split` by a pattern, `Isolated`, then `ByteLevel` without its own pattern; no prefix space), a BPE model
without dropout, byte fallback or affixes, and text of printable ASCII, tabs and line ends (where the regex
engines agree on every class the patterns use). The caller keeps the library for anything else, including
added tokens, which the text must not hold (`SegmentEncoder` hands it only the pieces between them).
`WordEncoder.of` also checks probes against the library and returns None when any differs.
"""

from __future__ import annotations

import json
import re
from typing import Any

from slime.utils.encoded_ids import ids_text


KEPT_WORDS = 200_000  # distinct words whose ids are kept (all dropped at once past it)
# the pattern `ByteLevel(use_regex=True)` splits with (the tokenizers library's, GPT-2's)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_ASCII_IDENTITY = {"NFC", "NFD", "NFKC", "NFKD"}
_NOT_PLAIN = re.compile(r"[^\t\n\r\x20-\x7e]")  # what the fast path does not take


def _byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte-to-character table, which `ByteLevel` maps every byte of a word through."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_ASCII_TO_BYTE_LEVEL = str.maketrans({chr(b): c for b, c in _byte_level_alphabet().items() if b < 128})


def _normalizer_keeps_ascii(config: Any) -> bool:
    if config is None:
        return True
    if config.get("type") == "Sequence":
        return all(_normalizer_keeps_ascii(c) for c in config.get("normalizers", []))
    return config.get("type") in _ASCII_IDENTITY


def _word_pattern(config: Any) -> str | None:
    """The pattern a byte-level pre-tokenizer cuts words with, or None when it is not one this path takes."""
    if not isinstance(config, dict):
        return None
    steps = config.get("pretokenizers") if config.get("type") == "Sequence" else [config]
    if not steps or any(not isinstance(s, dict) for s in steps):
        return None
    last = steps[-1]
    if last.get("type") != "ByteLevel" or last.get("add_prefix_space"):
        return None
    if len(steps) == 1:
        return GPT2_PATTERN if last.get("use_regex", True) else None
    split = steps[0]
    if (
        len(steps) != 2
        or last.get("use_regex", True)
        or split.get("type") != "Split"
        or split.get("behavior") != "Isolated"
        or split.get("invert")
        or "Regex" not in (split.get("pattern") or {})
    ):
        return None
    return split["pattern"]["Regex"]


def ascii_pattern(pattern: str) -> re.Pattern | None:
    """`pattern` for the standard library's `re` on the text this path takes (printable ASCII, tabs, line
    ends), where `\\p{L}` is `A-Za-z` and `\\p{N}` is `0-9` and `\\s` means what it means for the
    tokenizer's engine. None for any other Unicode property, a POSIX class (`[:alpha:]`, which `re` reads
    otherwise), or a pattern `re` does not compile: such a tokenizer keeps the library's own way."""
    if "[:" in pattern:
        return None
    out, i, in_class, class_start = [], 0, False, 0
    while i < len(pattern):
        if pattern.startswith(("\\p{L}", "\\p{N}"), i):
            letters = "A-Za-z" if pattern[i + 3] == "L" else "0-9"
            out.append(letters if in_class else f"[{letters}]")
            i += 5
            continue
        c = pattern[i]
        if c == "\\":
            if pattern[i + 1 : i + 2] in ("p", "P"):  # another property: not this path's
                return None
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            in_class, class_start = True, i + 1 + (pattern[i + 1 : i + 2] == "^")
        elif c == "]" and in_class and i > class_start:  # (a `]` first in a class is one of its characters)
            in_class = False
        out.append(c)
        i += 1
    try:
        return re.compile("".join(out))
    except re.error:
        return None


class WordEncoder:
    def __init__(self, backend: Any, words: re.Pattern, kept_words: int = KEPT_WORDS) -> None:
        self.model = backend.model
        self.words = words
        self.kept_words = kept_words
        self._ids: dict[str, list[int]] = {}
        self._texts: dict[str, str] = {}  # each kept word's ids as JSON array items (`EncodedIds` text)

    @classmethod
    def of(cls, backend: Any, **kwargs: Any) -> WordEncoder | None:
        """The encoder for a `tokenizers.Tokenizer`, or None where this path would not be the library's."""
        try:
            normalizer = json.loads(backend.normalizer.__getstate__()) if backend.normalizer is not None else None
            pattern = _word_pattern(json.loads(backend.pre_tokenizer.__getstate__()))
            model = backend.model
            plain_bpe = (
                type(model).__name__ == "BPE"
                and model.dropout is None
                and not model.byte_fallback
                and not model.continuing_subword_prefix
                and not model.end_of_word_suffix
            )
        except Exception:  # noqa: BLE001 - another library version or a tokenizer without these: the library's way
            return None
        words = ascii_pattern(pattern) if pattern is not None else None
        if words is None or not plain_bpe or not _normalizer_keeps_ascii(normalizer):
            return None
        encoder = cls(backend, words, **kwargs)
        return encoder if encoder.agrees(backend) else None

    def agrees(self, backend: Any) -> bool:
        probes = [
            "def f(x):\n    return x * 2  # it's 1,234.5\r\n\n\tdone; 'LL 'S  \n  ",
            "Traceback (most recent call last):\n  File \"a.py\", line 3\nKeyError: 'k'   \n\n\n",
            "   leading and trailing spaces   ",
            "a\r\n\r\nb  \t  c\t\n\x20",
        ]
        return all(self.encode(p) == backend.encode(p, add_special_tokens=False).ids for p in probes)

    @staticmethod
    def takes(text: str) -> bool:
        """Whether `text` is what this path encodes: printable ASCII, tabs and line ends."""
        return text.isascii() and _NOT_PLAIN.search(text) is None

    def encode(self, text: str, texts: list[str] | None = None) -> list[int] | None:
        """The library's ids of `text` (which holds no added token), or None when it is not plain ASCII. With
        `texts`, each word's ids as JSON array items appended to it, in order (kept with the word's ids: a delta's
        JSON text for the engine is a join of them, not an encoding of every id)."""
        if not self.takes(text):
            return None
        words = self.words.findall(text) if not self.words.groups else None
        if words is None or sum(map(len, words)) != len(text):
            words = self._all_words(text)  # (a pattern that leaves text uncovered, or one with groups)
        ids: list[int] = []
        kept = self._ids
        if texts is None:
            for word in words:
                found = kept.get(word)
                ids += found if found is not None else self._word(word)
            return ids
        kept_texts = self._texts
        for word in words:
            found = kept.get(word)
            if found is None:
                found = self._word(word)
            text = kept_texts.get(word)  # (None for a word `_word` has just put in new dicts, or another thread)
            texts.append(text if text is not None else ids_text(found))
            ids += found
        return ids

    def _all_words(self, text: str) -> list[str]:
        """The matches and, as `Isolated` keeps them, the stretches no match covers, in order."""
        words, end = [], 0
        for m in self.words.finditer(text):
            if m.start() > end:
                words.append(text[end : m.start()])
            if m.end() > m.start():
                words.append(m.group())
            end = max(end, m.end())
        if end < len(text):
            words.append(text[end:])
        return words

    def _word(self, word: str) -> list[int]:
        ids = [t.id for t in self.model.tokenize(word.translate(_ASCII_TO_BYTE_LEVEL))]
        if len(self._ids) >= self.kept_words:
            self._ids, self._texts = {}, {}
        self._ids[word], self._texts[word] = ids, ids_text(ids)
        return ids
