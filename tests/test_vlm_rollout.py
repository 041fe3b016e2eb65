"""Images from the data file to the training batch (`--multimodal-keys`, slime's flag) on the tiny VLM.

Preflight reads every row's images (paths beside the data file, data URIs, base64) and refuses a URL, a
missing file, a non-image or a placeholder count that does not match, naming the file and line. Then one
`slime-train` run (real Ray, router, embedded engine, DDP trainer) does a rollout and a GRPO step on a
JSONL of pictures drawn with Pillow: each sample's prompt tokens are the processor's, image tokens
included and outside the response (loss mask only over the answer), its `multimodal_train_inputs` hold
the pixel values and grids, the batch carries them, and the trainer's log-probs (the VLM's forward over
the pixels) equal the engine's, so the engine saw the same images.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest

from slime.cli.args import parse_args
from slime.cli.preflight import PreflightError, check_prompt_file, preflight

COLORS = ("red", "blue", "green", "orange")


def picture(color: str, size=(84, 56)):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    draw.polygon([(6, 50), (42, 6), (78, 50)], outline=color, width=4)
    draw.text((34, 30), color[0].upper(), fill=color)
    return img


def png_bytes(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def geometry_set(directory: Path) -> Path:
    """Four rows: a relative path, a data URI, bare base64 and (with two pictures) two `<image>` placeholders."""
    pics = {c: picture(c) for c in COLORS}
    (directory / "img").mkdir(exist_ok=True)
    pics["red"].save(directory / "img" / "red.png")
    uri = "data:image/png;base64," + base64.b64encode(png_bytes(pics["blue"])).decode()
    rows = [
        {"prompt": "What shape is drawn? Answer in one word.", "images": ["img/red.png"], "label": "triangle"},
        {"prompt": "<image>Which color is the triangle?", "images": [uri], "label": "blue"},
        {
            "prompt": "Name the shape.",
            "images": [base64.b64encode(png_bytes(pics["green"])).decode()],
            "label": "triangle",
        },
        {"prompt": "Compare <image> and <image>.", "images": ["img/red.png", uri], "label": "color"},
    ]
    path = directory / "geo.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def data_args(model: Path, data: Path, *extra: str):
    return parse_args(
        [
            "--hf-checkpoint",
            str(model),
            "--prompt-data",
            str(data),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--apply-chat-template",
            "--multimodal-keys",
            '{"image": "images"}',
            *extra,
        ]
    )


def test_rows_with_images_are_read_into_the_prompt_and_the_samples(tiny_vlm_dir, tmp_path):
    from slime.rollout.prompt_index import PromptIndex
    from slime.utils.processing_utils import load_tokenizer

    data = geometry_set(tmp_path)
    args = data_args(tiny_vlm_dir, data)
    assert check_prompt_file(args, "--prompt-data", str(data), "prompt", "label", load_tokenizer(tiny_vlm_dir)) == 4
    index = PromptIndex.from_args(args, data, "prompt", "label", load_tokenizer(tiny_vlm_dir))
    samples = [index[i] for i in range(4)]
    assert [len(s.multimodal_inputs["images"]) for s in samples] == [1, 1, 1, 2]
    assert [s.prompt.count("<|image_pad|>") for s in samples] == [1, 1, 1, 2]  # one placeholder each, unexpanded
    assert all(s.tokens == [] for s in samples)  # the processor tokenises them when generated
    # `<image>` marks where a picture goes; without one, pictures come before the text (Qwen's order)
    assert samples[1].prompt.index("<|vision_end|>") < samples[1].prompt.index("Which color")
    assert samples[3].prompt.index("Compare") < samples[3].prompt.index("<|vision_start|>")
    assert samples[0].metadata["messages"][0]["content"][0] == {"type": "image", "image": "img/red.png"}
    red = samples[0].multimodal_inputs["images"][0]
    assert red.size == (84, 56) and red.getpixel((42, 8)) != (255, 255, 255)
    # a sample's dict keeps its pictures, as PNG data URIs (JSON-safe, and what image_data takes)
    plain = samples[1].to_dict()
    json.dumps(plain)
    assert plain["multimodal_inputs"]["images"][0].startswith("data:image/png;base64,")
    index.close()


def test_the_processor_gives_torch_tensors_unasked_as_slimes_multi_turn_recipe_needs(tiny_vlm_dir):
    """slime's geo3k_vlm_multi_turn calls the processor without `return_tensors` and keeps only its
    `torch.Tensor` values as `multimodal_train_inputs` (torchvision's image backend returns tensors): with
    numpy arrays its samples trained without their pictures (train/rollout log-prob gap 5.6e-2)."""
    import torch

    from slime.utils.processing_utils import load_processor

    processor = load_processor(tiny_vlm_dir)
    text = "<|vision_start|><|image_pad|><|vision_end|>Which shape?"
    unasked = processor(text=text, images=[picture("red")])
    kept = {k: v for k, v in unasked.items() if isinstance(v, torch.Tensor)}  # the recipe's merge rule
    asked = processor(text=text, images=[picture("red")], return_tensors="pt")
    assert set(kept) == {"pixel_values", "image_grid_thw"}
    assert torch.equal(kept["pixel_values"], asked["pixel_values"])
    assert torch.equal(kept["image_grid_thw"], asked["image_grid_thw"])
    assert unasked["input_ids"][0] == asked["input_ids"][0].tolist()
    assert not isinstance(
        processor.image_processor(images=[picture("red")], return_tensors="np")["pixel_values"], torch.Tensor
    )  # an explicit request is still honoured


@pytest.mark.parametrize(
    "images, words",
    [
        (["https://example.com/a.png"], "is a URL; images are not downloaded"),
        (["img/none.png"], "image file not found: img/none.png"),
        (["data:image/png;base64,bm90IGFuIGltYWdl"], "the data URI is not an image"),
        ([["nested"]], "an image must be a path"),
    ],
)
def test_a_bad_image_is_refused_at_preflight_naming_file_line_and_image(tiny_vlm_dir, tmp_path, images, words):
    data = tmp_path / "bad.jsonl"
    good = {"prompt": "ok?", "images": [], "label": "x"}
    data.write_text(json.dumps(good) + "\n" + json.dumps({**good, "images": images}) + "\n")
    with pytest.raises(PreflightError) as err:
        preflight(data_args(tiny_vlm_dir, data))
    assert f"--prompt-data: {data}:2: --multimodal-keys image='images': images[0]: " in str(err.value)
    assert words in str(err.value)


def test_placeholders_must_match_the_images_and_the_checkpoint_must_see(tiny_vlm_dir, tiny_model_dir, tmp_path):
    data = tmp_path / "count.jsonl"
    data.write_text(json.dumps({"prompt": "<image> vs <image>", "images": ["a.png"], "label": "x"}) + "\n")
    picture("red").save(tmp_path / "a.png")
    with pytest.raises(
        PreflightError,
        match=r"count.jsonl:1: the prompt has 2 <image> placeholder\(s\) but the row "
        r"has 1 image\(s\)",
    ):
        preflight(data_args(tiny_vlm_dir, data))
    with pytest.raises(PreflightError, match="--multimodal-keys: --hf-checkpoint .* has no vision tower"):
        preflight(data_args(tiny_model_dir, data))
    with pytest.raises(PreflightError, match="only images are read here"):
        preflight(data_args(tiny_vlm_dir, data, "--multimodal-keys", '{"video": "videos"}'))


# ---------------------------------------------------------------- one rollout and one GRPO step


@pytest.fixture(scope="module")
def trained(ray_cluster, engine_fork_server, tiny_vlm_dir, tmp_path_factory):
    from slime.cli.train import parse_train_args
    from slime.train.loop import train

    out = tmp_path_factory.mktemp("vlm-train")
    data = geometry_set(out)
    args = parse_train_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_vlm_dir),
            "--prompt-data",
            str(data),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--apply-chat-template",
            "--multimodal-keys",
            '{"image": "images"}',
            "--rollout-num-engines",
            "1",
            "--actor-num-workers",
            "1",
            "--rollout-num-cpus-per-engine",
            "0.5",
            "--engine-threads",
            "1",
            "--actor-num-cpus-per-worker",
            "0.5",
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--rollout-max-response-len",
            "6",
            "--custom-rm-path",
            "tests.plugins.train_rewards.even_token_fraction",
            "--lr",
            "1e-3",
            "--global-batch-size",
            "4",
            "--micro-batch-size",
            "2",
            "--num-rollout",
            "1",
            "--check-weight-update-equal",
            # seeded sampling (slime's switch): unseeded, both samples of each group can draw equal rewards (it
            # happened once, on a fresh clone at load ~4): every advantage is then 0, and so is the step's gradient
            "--sglang-enable-deterministic-inference",
            "--rollout-seed",
            "42",
            "--save-debug-rollout-data",
            str(out / "debug" / "rollout_{rollout_id}.pt"),
            "--log-dir",
            str(out / "logs"),
        ]
    )
    return train(args, fork_server=engine_fork_server), out  # the engine forked warm, loading the VLM itself


def test_one_rollout_and_one_grpo_step_on_images(trained, tiny_vlm_dir):
    from slime.rollout.debug_data import load_debug_rollout
    from slime.utils.processing_utils import load_processor

    records, out = trained
    samples = load_debug_rollout(str(out / "debug" / "rollout_{rollout_id}.pt"), 0)
    assert len(samples) == 4 and {s.status.value for s in samples} <= {"completed", "truncated"}
    pad = load_processor(tiny_vlm_dir).image_token_id
    for s in samples:
        grid = s.multimodal_train_inputs["image_grid_thw"]
        pixels = s.multimodal_train_inputs["pixel_values"]
        per_image = [t * h * w // 4 for t, h, w in grid]  # merge 2x2 patches into one token
        prompt = s.tokens[: len(s.tokens) - s.response_length]
        assert prompt.count(pad) == sum(per_image) > 0  # expanded, in the prompt, as the engine ran it
        assert pad not in s.tokens[len(prompt) :]  # no image token in the response
        assert len(s.loss_mask) == s.response_length == len(s.rollout_log_probs) > 0
        assert len(pixels) == sum(t * h * w for t, h, w in grid)  # one row of pixels per patch
    record = records[0]
    print(
        f"train/rollout log-prob diff mean {record.rollout['train_rollout_logprob_abs_diff']:.2e} "
        f"max {record.rollout['train_rollout_logprob_abs_diff_max']:.2e}"
    )
    assert record.rollout["train_rollout_logprob_abs_diff_max"] < 1e-4  # the trainer saw the engine's images
    assert len(record.steps) == 1 and record.steps[0]["grad_norm"] > 0
    assert all(c["equal"] for c in record.weight_check)  # the VLM's weights (vision tower too) reach the engine
