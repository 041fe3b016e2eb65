"""`WordEncoder` gives the library's own ids for any plain ASCII text (Qwen's split pattern, GPT-2's byte-level
one), hands back anything else, and refuses the tokenizers whose pipeline it is not."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from slime.tools.word_encoder import WordEncoder
from slime.utils.encoded_ids import ids_text

CORPUS = [
    "def main(argv):\n    return {'a': [1, 2, 3]}  # it's done\n\n",
    'Traceback (most recent call last):\n  File "x.py", line 12, in <module>\nValueError: bad value\r\n',
    "PASSED tests/test_parser.py::test_trailing_comma   [ 50%]\n\tok    \n",
]


@pytest.fixture(scope="module")
def qwen_backend(tiny_tokenizer):
    """The Rust tokenizer under the tests' Qwen3 tokenizer (conftest's, loaded once per session)."""
    return tiny_tokenizer._tokenizer


def trained(pre_tokenizer, *, normalizer=None, dropout=None) -> Tokenizer:
    tok = Tokenizer(models.BPE(dropout=dropout))
    tok.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS * 20, trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    return tok


GPT2_STYLE = trained(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))

FRAGMENTS = [
    "def",
    "return",
    "Value",
    "x",
    "ABC",
    "'s",
    "'S",
    "'ll",
    "'LL",
    "'d",
    "'",
    "0",
    "12",
    "3.14",
    "_",
    "::",
    "(",
    ")",
    "{",
    "}",
    "#",
    "!=",
    "...",
    '"',
    "`",
    "~",
    " ",
    "  ",
    "    ",
    "\t",
    "\n",
    "\r\n",
    "\n\n",
    " \n",
    "\r",
]
ascii_texts = st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=60).map("".join)
printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.sampled_from("\t\n\r"), min_size=1)


def assert_texts(encoder: WordEncoder, text: str, want: list[int]) -> None:
    """The words' JSON texts, joined, are the ids' JSON text: for words met before (kept) and new ones."""
    for fresh in (False, True):
        if fresh:
            encoder._ids, encoder._texts = {}, {}
        texts: list[str] = []
        assert encoder.encode(text, texts) == want
        assert ", ".join(t for t in texts if t) == ids_text(want)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=ascii_texts | printable)
def test_qwen_ids_are_the_librarys(qwen_backend, text):
    encoder = WordEncoder.of(qwen_backend)
    assert encoder is not None
    want = qwen_backend.encode(text, add_special_tokens=False).ids
    assert encoder.encode(text) == want
    assert encoder.encode(text) == want  # the words' kept ids
    assert_texts(encoder, text, want)


@settings(max_examples=300, deadline=None)
@given(text=ascii_texts | printable)
def test_gpt2_byte_level_ids_are_the_librarys(text):
    encoder = WordEncoder.of(GPT2_STYLE, kept_words=5)  # (a small budget: the kept words dropped and met again)
    assert encoder is not None
    want = GPT2_STYLE.encode(text, add_special_tokens=False).ids
    assert encoder.encode(text) == want
    assert encoder.encode(text) == want
    assert_texts(encoder, text, want)


@pytest.mark.parametrize("text", ["caf\u00e9 au lait", "tab\x0bvertical", "bell\x07", "nul\x00", "\x1c sep", "del\x7f"])
def test_text_it_hands_back(qwen_backend, text):
    assert WordEncoder.of(qwen_backend).encode(text) is None


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: trained(pre_tokenizers.ByteLevel(add_prefix_space=True)), id="prefix-space"),
        pytest.param(lambda: trained(pre_tokenizers.Metaspace()), id="metaspace"),
        pytest.param(lambda: trained(pre_tokenizers.ByteLevel(), normalizer=normalizers.Lowercase()), id="lowercase"),
        pytest.param(lambda: trained(pre_tokenizers.ByteLevel(), dropout=0.1), id="dropout"),
        pytest.param(
            lambda: trained(pre_tokenizers.Sequence([pre_tokenizers.Digits(), pre_tokenizers.ByteLevel()])),
            id="digits-then-byte-level",
        ),
    ],
)
def test_tokenizers_it_refuses(make):
    assert WordEncoder.of(make()) is None


def test_a_tool_result_through_the_segment_encoder(qwen_backend):
    from slime.tools.segment_encoder import SegmentEncoder

    result = "".join(f"{k}: def function_{k}(value):  return value * {k}  # helper\n" for k in range(80))
    text = f"<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    encoder = SegmentEncoder.of(qwen_backend)
    assert encoder.words is not None
    assert encoder.encode(text) == qwen_backend.encode(text, add_special_tokens=False).ids
    assert len(encoder.words._ids) > 10  # the piece went word by word


def test_ascii_pattern_writes_out_letters_and_digits_only():
    import re

    from slime.tools.word_encoder import GPT2_PATTERN, ascii_pattern

    assert ascii_pattern(GPT2_PATTERN).pattern == (
        r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"
    )
    assert ascii_pattern(r"[^\r\n\p{L}\p{N}]?\p{L}+").pattern == r"[^\r\nA-Za-z0-9]?[A-Za-z]+"
    assert ascii_pattern(r"[]\p{L}]\p{N}").pattern == r"[]A-Za-z][0-9]"  # a leading `]` is in its class
    assert ascii_pattern(r"[^]\p{N}]").pattern == r"[^]0-9]"
    for other in (r"\p{Lu}+", r"\P{L}", "[[:alpha:]]+", r"\p{L}(?P<"):  # only `regex` reads these (or nobody)
        assert ascii_pattern(other) is None
    assert isinstance(WordEncoder.of(GPT2_STYLE).words, re.Pattern)
