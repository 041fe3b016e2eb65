"""A prompt with images as the default generate sends it: the checkpoint's processor renders and expands
it once, the sample keeps what the trainer needs, the engine gets the same ids and the images.

slime's order (`sglang_rollout._prepare_prompt_ids`): the processor's `input_ids` are the prompt's tokens
(every image already expanded to its `<|image_pad|>` count, so the sample's tokens are exactly what the
engine ran), its other outputs (`pixel_values`, `image_grid_thw`) are `Sample.multimodal_train_inputs`,
and `image_data` carries the images as PNG data URIs. A sample that already has both its tokens and its
train inputs (a continued partial rollout, a plugin's) is sent as it is.
"""

from __future__ import annotations

from typing import Any

from slime.utils.images import encode_png_data_uri, open_image
from slime.utils.processing_utils import build_processor_kwargs, load_processor
from slime.utils.types import Sample

PROCESSOR_KEY = "sglang_rollout.processor"  # the runtime's shared processor (GenerateState.processor too)
_PROMPT_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids")  # the processor's outputs that are not train inputs


def sample_images(sample: Sample) -> list[Any]:
    return list((sample.multimodal_inputs or {}).get("images") or [])


def _load(path: str | None) -> Any:
    return load_processor(path, trust_remote_code=True) if path else None


def shared_processor(runtime: Any) -> Any:
    """`load_processor(--hf-checkpoint)` once per runtime (its config's checkpoint); None for a text-only one."""
    return runtime.shared(PROCESSOR_KEY, lambda: _load(runtime.config.hf_checkpoint))


def multimodal_prompt(sample: Sample, runtime: Any) -> tuple[list[int], list[str]]:
    """(the prompt's ids with every image expanded, the images as `image_data`) of a sample with images;
    fills `sample.multimodal_train_inputs` the first time."""
    images = [open_image(img) for img in sample_images(sample)]  # PIL, or data URIs after a dict round trip
    image_data = [encode_png_data_uri(img) for img in images]
    if sample.tokens and sample.multimodal_train_inputs is not None:
        return list(sample.tokens[: len(sample.tokens) - sample.response_length]), image_data
    processor = shared_processor(runtime)
    if processor is None:
        raise ValueError(
            f"sample {sample.index} has {len(images)} image(s) (--multimodal-keys) but "
            f"--hf-checkpoint {runtime.config.hf_checkpoint} has no image processor "
            "(a vision-language checkpoint ships preprocessor_config.json)"
        )
    text = sample.prompt
    if not isinstance(text, str):
        text = runtime.tokenizer.apply_chat_template(
            text, tokenize=False, add_generation_prompt=True, **(sample.apply_chat_template_kwargs or {})
        )
    enc = processor(text=text, **build_processor_kwargs({"images": images}))
    sample.multimodal_train_inputs = {k: v for k, v in enc.items() if k not in _PROMPT_KEYS} or None
    return [int(t) for t in enc["input_ids"][0]], image_data
