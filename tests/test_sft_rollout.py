"""`slime.rollout.sft_rollout` and `MultiTurnLossMaskGenerator` on real chat tokenizers: exact token ids
and loss masks (assistant turns 1, everything else 0), expected values built from the template's text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slime.cli.args import parse_args
from slime.rollout.data_source import DataSource
from slime.rollout.sft_rollout import generate_rollout
from slime.utils.mask_utils import MultiTurnLossMaskGenerator, get_response_lengths
from slime.utils.processing_utils import load_processor, load_tokenizer
from slime.utils.types import Sample

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "Bye!"},
]
SHORT = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate.",
            "parameters": {"type": "object", "properties": {"e": {"type": "string"}}, "required": ["e"]},
        },
    }
]
TOOL_CHAT = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "Q"},
    {
        "role": "assistant",
        "content": "call",
        "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"e": "1+1"}}}],
    },
    {"role": "tool", "content": "2"},
    {"role": "tool", "content": "3"},
    {"role": "assistant", "content": "done", "step_loss_mask": 0},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "x"},
]
SMOL_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def expected(tok, pieces: list[tuple[str, int]]) -> tuple[list[int], list[int]]:
    """Token ids and mask of text pieces (each piece ends at a special token, so pieces tokenize alone)."""
    ids, mask = [], []
    for text, trainable in pieces:
        t = tok(text, add_special_tokens=False)["input_ids"]
        ids += t
        mask += [trainable] * len(t)
    return ids, mask


def turn(role: str, content: str) -> tuple[str, int]:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n", 0


def reply(content: str, head: str = "") -> list[tuple[str, int]]:
    return [("<|im_start|>assistant\n", 0), (f"{head}{content}<|im_end|>\n", 1)]


@pytest.fixture(scope="module")
def qwen_tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def smol_dir():
    from slime.engine.default_model import ensure_default_model

    return ensure_default_model()


def _args(tmp_path: Path, model_dir: Path, rows: list[dict], *extra: str):
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = parse_args(
        [
            "--hf-checkpoint",
            str(model_dir),
            "--prompt-data",
            str(data),
            "--input-key",
            "messages",
            "--rollout-batch-size",
            str(len(rows)),
            "--rollout-backend",
            "hf",
            *extra,
        ]
    )
    return args, DataSource.from_args(args)


# ---------------------------------------------------------------- generate_rollout


def test_sft_rollout_qwen_mask_type(tmp_path, tiny_model_dir, qwen_tok):
    args, source = _args(tmp_path, tiny_model_dir, [{"messages": CHAT}, {"messages": SHORT}])
    args.loss_mask_type = "qwen"
    groups = generate_rollout(args, 0, source)
    assert [len(g) for g in groups] == [1, 1]
    (chat,), (short,) = groups
    ids, mask = expected(
        qwen_tok,
        [turn("system", "Be brief."), turn("user", "Hi"), *reply("Hello!"), turn("user", "Bye"), *reply("Bye!")],
    )
    first = mask.index(1)
    assert chat.tokens == ids and chat.response_length == len(ids) - first and chat.loss_mask == mask[first:]
    assert chat.reward == 0 and chat.prompt == CHAT and chat.prompt_length == first
    ids, mask = expected(qwen_tok, [turn("user", "2+2?"), *reply("4")])
    assert short.tokens == ids and short.loss_mask == [1, 1, 1] and short.response_length == 3
    assert qwen_tok.decode(short.tokens[-3:]) == "4<|im_end|>\n"


def test_sft_rollout_qwen3_with_tools_and_step_loss_mask(tmp_path, tiny_model_dir, qwen_tok):
    args, source = _args(tmp_path, tiny_model_dir, [{"messages": TOOL_CHAT, "tools": TOOLS}])
    args.loss_mask_type = "qwen3"
    ((sample,),) = generate_rollout(args, 3, source)
    assert sample.metadata["tools"] == TOOLS
    system = qwen_tok.apply_chat_template(TOOL_CHAT[:1], tools=TOOLS, tokenize=False)
    think = "<think>\n\n</think>\n\n"  # Qwen3's template renders the last assistant turn with a think block
    call = 'call\n<tool_call>\n{"name": "calc", "arguments": {"e": "1+1"}}\n</tool_call>'
    tools_turn = (
        "<|im_start|>user\n<tool_response>\n2\n</tool_response>\n<tool_response>\n3\n</tool_response><|im_end|>\n"
    )
    ids, mask = expected(
        qwen_tok,
        [
            (system, 0),
            turn("user", "Q"),
            *reply(call, think),
            (tools_turn, 0),
            ("<|im_start|>assistant\n" + think + "done<|im_end|>\n", 0),  # step_loss_mask 0
            turn("user", "again"),
            *reply("x", think),
        ],
    )
    first = mask.index(1)
    assert sample.tokens == ids and sample.loss_mask == mask[first:]
    gen = MultiTurnLossMaskGenerator(qwen_tok, "qwen3")
    assert gen.get_text_from_loss_mask(*gen.get_loss_mask(TOOL_CHAT, tools=TOOLS)) == [
        think + call + "<|im_end|>\n",
        think + "x<|im_end|>\n",
    ]


def test_sft_rollout_smollm2_default_system_prompt(tmp_path, smol_dir):
    tok = load_tokenizer(smol_dir)
    args, source = _args(
        tmp_path,
        smol_dir,
        [{"messages": SHORT + [{"role": "user", "content": "More"}, {"role": "assistant", "content": "5"}]}],
    )
    ((sample,),) = generate_rollout(args, 0, source)  # --loss-mask-type unset: slime's default "qwen"
    # SmolLM2's template puts its default system prompt before a lone message; it appears once
    ids, mask = expected(tok, [(SMOL_SYSTEM, 0), turn("user", "2+2?"), *reply("4"), turn("user", "More"), *reply("5")])
    first = mask.index(1)
    assert sample.tokens == ids and sample.loss_mask == mask[first:]
    assert sample.tokens == tok.apply_chat_template(sample.prompt, tokenize=True, return_dict=False)


def test_sft_rollout_through_the_controller(tmp_path, tiny_model_dir, qwen_tok):
    from slime.rollout.controller import RolloutController
    from slime.rollout.runtime import unbind
    from slime.utils.endpoints import Endpoints

    args, _ = _args(
        tmp_path,
        tiny_model_dir,
        [{"messages": SHORT}, {"messages": CHAT}],
        "--rollout-function-path",
        "slime.rollout.sft_rollout.generate_rollout",
    )
    controller = RolloutController(args, Endpoints())
    try:
        batch = controller.generate(0)
    finally:
        unbind(controller.runtime)
    ids, mask = expected(qwen_tok, [turn("user", "2+2?"), *reply("4")])
    assert batch["tokens"][0] == ids and batch["loss_masks"][0] == [1, 1, 1] and batch["response_lengths"][0] == 3
    assert batch["raw_reward"] == [0.0, 0.0] and len(batch["loss_masks"][1]) == batch["response_lengths"][1]


def test_sft_rollout_errors(tmp_path, tiny_model_dir):
    args, source = _args(tmp_path, tiny_model_dir, [{"messages": SHORT}])
    with pytest.raises(ValueError, match="sft_rollout cannot evaluate"):
        generate_rollout(args, 0, source, evaluation=True)
    args.rollout_global_dataset = False
    with pytest.raises(ValueError, match="drop --disable-rollout-global-dataset"):
        generate_rollout(args, 0, source)
    args.rollout_global_dataset, args.loss_mask_type = True, "llama"
    with pytest.raises(ValueError, match="--loss-mask-type 'llama' is not supported"):
        generate_rollout(args, 0, source)
    args.loss_mask_type = "qwen"
    bad, bad_source = _args(tmp_path, tiny_model_dir, [{"messages": "plain text"}])
    with pytest.raises(ValueError, match="sample 0 has no message list as prompt.*--input-key"):
        generate_rollout(bad, 0, bad_source)


# ---------------------------------------------------------------- mask_utils / processing_utils units


def test_mask_generator_probes_and_modes(qwen_tok):
    gen = MultiTurnLossMaskGenerator(qwen_tok, "qwen")
    assert (gen.system_message_length, gen.gen_token_length) == (0, 3)  # Qwen3: no default system prompt
    assert (
        gen.get_response_lengths([[0, 1, 0, 1], [0, 0], [1]])
        == [3, 0, 1]
        == get_response_lengths([[0, 1, 0, 1], [0, 0], [1]])
    )
    assert gen.find_all_sublist_indices([1, 2, 1, 2, 1], [1, 2]) == [0, 2]
    # qwen3_5: one rendering, spans by character offsets; the "<think>\n" prefix is not trained, but the
    # "\n\n" token straddling its end is (a token counts when any of its characters is trainable)
    ids, mask = MultiTurnLossMaskGenerator(qwen_tok, "qwen3_5").get_loss_mask(CHAT)
    assert ids == qwen_tok.apply_chat_template(CHAT, tokenize=True, return_dict=False)
    masked = MultiTurnLossMaskGenerator(qwen_tok, "qwen3_5").get_text_from_loss_mask(ids, mask)
    assert masked == ["Hello!<|im_end|>\n", "\n\n</think>\n\nBye!<|im_end|>\n"]
    # distill_qwen: first message as prompt, last content as response
    ids, mask = MultiTurnLossMaskGenerator(qwen_tok, "distill_qwen").get_loss_mask(SHORT)
    prompt = qwen_tok.apply_chat_template(SHORT[:1], tokenize=False, add_generation_prompt=True)
    assert ids == qwen_tok(prompt + "4", add_special_tokens=False)["input_ids"] and mask[-1] == 1 and sum(mask) == 1
    # multimodal alignment: text parts only, left-padded to the processor's ids
    mm = [{"role": "user", "content": [{"type": "image", "image": "x"}, {"type": "text", "text": "2+2?"}]}, SHORT[1]]
    _, text_mask = gen.get_loss_mask(SHORT)
    assert gen.get_loss_mask_with_multimodal_alignment(mm, list(range(len(text_mask) + 4)))[1] == [0] * 4 + text_mask
    with pytest.raises(ValueError, match="shorter than text loss_mask"):
        gen.get_loss_mask_with_multimodal_alignment(mm, [1])


def test_processing_utils_local_only(tmp_path, tiny_model_dir):
    assert load_processor(tiny_model_dir, trust_remote_code=True) is None  # text-only model
    with pytest.raises(FileNotFoundError, match="'Qwen/Qwen3-8B' is not a local model directory"):
        load_tokenizer("Qwen/Qwen3-8B")
    from slime.utils.processing_utils import build_processor_kwargs

    assert build_processor_kwargs({"images_kwargs": {"max_pixels": 4}}) == {
        "images_kwargs": {"max_pixels": 4, "return_tensors": "pt"},
        "audio_kwargs": {"return_tensors": "pt"},
        "videos_kwargs": {"return_tensors": "pt"},
        "text_kwargs": {"return_tensors": None, "return_mm_token_type_ids": False},
    }


def test_encode_image_for_rollout_engine():
    from PIL import Image

    from slime.utils.processing_utils import encode_image_for_rollout_engine, process_vision_info

    img = Image.new("L", (2, 2), color=7)
    uri = encode_image_for_rollout_engine(img)
    assert uri.startswith("data:image/png;base64,")
    msgs = [{"role": "user", "content": [{"type": "image", "image": uri}, {"type": "text", "text": "what?"}]}]
    info = process_vision_info(msgs, processor=None)
    assert info["videos"] is None and [(i.mode, i.size) for i in info["images"]] == [("RGB", (2, 2))]
    assert Sample(multimodal_inputs={"images": [uri]}).to_dict()["multimodal_inputs"] == {"images": [uri]}
