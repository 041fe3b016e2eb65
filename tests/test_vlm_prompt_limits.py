"""Images in the prompt-length filter and in `--eval-config` (tiny Qwen2-VL's processor, no engine).

The filter counts a prompt as the engine will run it: each image expanded to its token count (a 112x112
picture: 16 tokens, not the one placeholder the template writes), so a prompt that only fits unexpanded
is dropped. An eval dataset of `--eval-config` may name its own `multimodal_keys` (slime's per-dataset
field): its rows' pictures are read under that key even when `--multimodal-keys` is unset.
"""

from __future__ import annotations

import json

import pytest

from slime.cli.args import parse_args
from slime.rollout.evaluation import dataset_multimodal_keys, eval_prompts
from slime.rollout.flags import RolloutRunConfig
from slime.rollout.prompt_index import PromptIndex
from slime.utils.eval_config import EvalDatasetConfig


def square(path):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (112, 112), "white")
    ImageDraw.Draw(img).rectangle((20, 20, 90, 90), fill="blue")
    img.save(path)


@pytest.fixture
def data(tmp_path):
    square(tmp_path / "sq.png")
    rows = [
        {"prompt": "<image>What shape is this?", "pics": ["sq.png"], "label": "square"},
        {"prompt": "What shape has four equal sides?", "pics": [], "label": "square"},
    ]
    path = tmp_path / "shapes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def args_for(model, data, *extra):
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
            *extra,
        ]
    )


def test_the_prompt_length_filter_counts_each_image_at_its_token_count(tiny_vlm_dir, data):
    from slime.utils.processing_utils import load_tokenizer

    tok = load_tokenizer(tiny_vlm_dir)
    keys = ("--multimodal-keys", '{"image": "pics"}')
    whole = PromptIndex.from_args(args_for(tiny_vlm_dir, data, *keys), data, "prompt", "label", tok)
    written = len(tok(whole[0].prompt, add_special_tokens=False)["input_ids"])  # one placeholder for the picture
    text_len = len(whole[1].tokens)
    assert text_len < written + 5
    limit = ("--rollout-max-prompt-len", str(written + 5))  # fits as written, not as the engine runs it (+15)
    index = PromptIndex.from_args(args_for(tiny_vlm_dir, data, *keys, *limit), data, "prompt", "label", tok)
    assert index.filtered == 1 and len(index) == 1 and index[0].multimodal_inputs is None
    roomy = PromptIndex.from_args(
        args_for(tiny_vlm_dir, data, *keys, "--rollout-max-prompt-len", str(written + 15)), data, "prompt", "label", tok
    )
    assert roomy.filtered == 0


class Runtime:
    """What `eval_prompts` asks of the rollout runtime: the tokenizer and a once-per-key cache."""

    def __init__(self, tokenizer):
        self.tokenizer, self.cache = tokenizer, {}

    def shared(self, key, build):
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]


def test_an_eval_dataset_reads_images_under_its_own_multimodal_keys(tiny_vlm_dir, data):
    from slime.utils.processing_utils import load_tokenizer

    args = args_for(tiny_vlm_dir, data)  # no --multimodal-keys: the training data is text
    runtime = Runtime(load_tokenizer(tiny_vlm_dir))
    pictures = EvalDatasetConfig("shapes", str(data), multimodal_keys={"image": "pics"})
    plain = EvalDatasetConfig("shapes-text", str(data))
    config = RolloutRunConfig.from_args(args)
    with_images = eval_prompts(config, pictures, runtime)
    assert with_images[0].multimodal_inputs["images"][0].size == (112, 112)
    assert "<|image_pad|>" in with_images[0].prompt and with_images[1].multimodal_inputs is None
    without = eval_prompts(config, plain, runtime)
    assert without[0].multimodal_inputs is None and "<|image_pad|>" not in without[0].prompt
    assert dataset_multimodal_keys(EvalDatasetConfig("j", "x", multimodal_keys='{"image": "p"}'), None) == {
        "image": "p"
    }
    with pytest.raises(ValueError, match="dataset 'bad': multimodal_keys must be a mapping"):
        dataset_multimodal_keys(EvalDatasetConfig("bad", "x", multimodal_keys=["images"]), None)
