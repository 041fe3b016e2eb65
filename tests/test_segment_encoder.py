"""`SegmentEncoder` gives the library's own ids for any text (long pieces kept, met again, dropped), and
refuses the tokenizers where cutting at added tokens is not where the library cuts."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from slime.tools.segment_encoder import SegmentEncoder
from slime.utils.encoded_ids import ids_text

CORPUS = [
    "The quick brown fox jumps over the lazy dog. 12345 café naïve",
    "def main():\n    return {'a': [1, 2, 3]}\n\n# done",
    "Tool results: <tool_response>ok</tool_response> and more text here",
]


@pytest.fixture(scope="module")
def qwen_backend(tiny_tokenizer):
    """The Rust tokenizer under the tests' Qwen3 tokenizer (conftest's, loaded once per session)."""
    return tiny_tokenizer._tokenizer


def trained(pre_tokenizer, *, added: list[AddedToken], normalizer=None) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet() if "ByteLevel" in repr(pre_tokenizer) else []
    tok.train_from_iterator(
        CORPUS * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"], initial_alphabet=alphabet)
    )
    tok.add_special_tokens([a for a in added if a.special])
    tok.add_tokens([a for a in added if not a.special])
    return tok


def byte_level_with_prefix_space() -> Tokenizer:
    return trained(
        pre_tokenizers.ByteLevel(add_prefix_space=True),
        added=[
            AddedToken("<s>", special=True, normalized=False),
            AddedToken("</s>", special=True, normalized=False),
            AddedToken("<tool>", special=False, normalized=False),
            AddedToken("<tool>call", special=False, normalized=False),  # the longest match wins
        ],
        normalizer=normalizers.NFC(),
    )


PIECES = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "<s>",
    "</s>",
    "<tool>",
    "<tool>call",
    "call",
    "<|im_",  # near misses of added tokens
    "<think",
    "|>",
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "e\u0301",  # NFC composes it
    "é",
    "中文",
    "123",
    "user",
    "assistant",
    "Hello, world!",
    "{'cmd': 'ls -la'}",
]
texts = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)


def check(encoder: SegmentEncoder, backend: Tokenizer, text: str) -> None:
    want = backend.encode(text, add_special_tokens=False).ids
    assert encoder.encode(text) == want  # the pieces met first
    assert encoder.encode(text) == want  # and met again (kept, or dropped by a small budget)
    encoded = encoder.encode_json(text)  # the JSON text the engine gets, built from the pieces' own
    assert encoded == want and encoded.text == ids_text(want)
    assert encoder._kept_chars <= encoder.kept_limit
    assert encoder._kept_chars == sum(len(p) for p in encoder._kept)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(texts, min_size=1, max_size=4), min_chars=st.integers(1, 12), kept=st.integers(1, 60))
def test_qwen_ids_are_the_librarys(qwen_backend, texts, min_chars, kept):
    encoder = SegmentEncoder.of(qwen_backend, min_chars=min_chars, kept_chars=kept)
    assert encoder is not None
    for text in texts:
        check(encoder, qwen_backend, text)


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(texts, min_size=1, max_size=4), min_chars=st.integers(1, 12))
@example(texts=["a<tool>call me<s>"], min_chars=1)
def test_byte_level_with_a_prefix_space_per_piece(texts, min_chars):
    backend = BYTE_LEVEL
    encoder = SegmentEncoder.of(backend, min_chars=min_chars)
    assert encoder is not None
    for text in texts:
        check(encoder, backend, text)


BYTE_LEVEL = byte_level_with_prefix_space()


def test_a_long_system_message_is_encoded_once(qwen_backend):
    system = "<|im_start|>system\n" + "You are an agent working in /workspace. " * 40 + "<|im_end|>\n"
    encoder = SegmentEncoder.of(qwen_backend)
    for task in range(3):
        text = f"{system}<|im_start|>user\nTask {task}<|im_end|>\n<|im_start|>assistant\n"
        assert encoder.encode(text) == qwen_backend.encode(text, add_special_tokens=False).ids
    assert list(encoder._kept) == ["system\n" + "You are an agent working in /workspace. " * 40]


def test_tokens_added_later_are_cut_where_the_library_cuts(qwen_backend):
    backend = Tokenizer.from_str(qwen_backend.to_str())
    encoder = SegmentEncoder.of(backend, min_chars=4)
    backend.add_special_tokens([AddedToken("<new>", special=True, normalized=False)])
    text = "a long piece<new>another long piece<|im_end|>"
    assert encoder.encode(text) == backend.encode(text, add_special_tokens=False).ids
    backend.encode_special_tokens = True  # special tokens written as text: the library's own way
    assert encoder.encode(text) == backend.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(
            lambda: trained(
                pre_tokenizers.Metaspace(prepend_scheme="first"),
                added=[AddedToken("<s>", special=True, normalized=False)],
            ),
            id="metaspace-first",
        ),
        pytest.param(
            lambda: trained(
                pre_tokenizers.ByteLevel(), added=[AddedToken("<mask>", special=True, normalized=False, lstrip=True)]
            ),
            id="lstrip",
        ),
        pytest.param(
            lambda: trained(pre_tokenizers.ByteLevel(), added=[AddedToken("<x>", special=False, normalized=True)]),
            id="normalized",
        ),
    ],
)
def test_tokenizers_it_refuses(make):
    assert SegmentEncoder.of(make()) is None


def test_metaspace_first_would_differ():
    """Why Metaspace `prepend_scheme="first"` is refused: a piece encoded alone gets the prefix the
    library gives the text's first piece only."""
    backend = trained(pre_tokenizers.Metaspace(prepend_scheme="first"), added=[AddedToken("<s>", special=True)])
    whole = backend.encode("<s>quick brown", add_special_tokens=False).ids
    assert whole[1:] != backend.encode("quick brown", add_special_tokens=False).ids


def test_chat_delta_prompt_ids_with_a_kept_system_message(tiny_tokenizer):
    from slime.tools.chat_format import ChatDelta

    tok = tiny_tokenizer
    delta = ChatDelta(tok)
    assert delta._segments is not None
    tools = [
        {
            "type": "function",
            "function": {
                "name": "run",
                "description": "Run a shell command in the sandbox. " * 10,
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            },
        }
    ]
    system = {"role": "system", "content": "You fix failing tests in the repository at /workspace. " * 20}
    for task in range(3):
        messages = [system, {"role": "user", "content": f"Task {task}: " + "the parser drops a field. " * 15}]
        want = tok.apply_chat_template(
            messages, tools=tools, tokenize=True, add_generation_prompt=True, return_dict=False
        )
        assert delta.prompt_ids(messages, tools) == list(want)
        ids = delta.prompt_encoded_ids(messages, tools)
        assert ids == list(want) and ids.text == ids_text(list(want))
    assert any(piece.startswith("system\n") for piece in delta._segments._kept)


def test_chat_delta_tool_results_with_their_text(tiny_tokenizer):
    """A gateway turn's delta (turn end, tool results, the next generation prompt) as `EncodedIds`: the ids
    `tool_delta_ids` gives, and a JSON text joined from its words' and pieces' own that is those ids'."""
    from slime.tools.chat_format import ChatDelta

    delta = ChatDelta(tiny_tokenizer)
    model_ids = tiny_tokenizer.encode("I will read it.<|im_end|>", add_special_tokens=False)
    for k in range(3):
        result = "".join(f"{k}.{i}: def function_{i}(value):  return value * {i}\n" for i in range(60))
        tools = [{"role": "tool", "content": result}, {"role": "tool", "content": f"exit code {k} (caf\u00e9)"}]
        want = delta.tool_delta_ids(tools, model_ids)
        for _ in range(2):  # words and pieces met first, then kept
            ids = delta.tool_delta_encoded_ids(tools, model_ids)
            assert ids == want and ids.text == ids_text(want)
