"""Vision-language checkpoints (transformers' Qwen2-VL / Qwen2.5-VL classes) as the engine and the trainer
run them: which class loads a checkpoint, where its image tokens are, and the multimodal rotary positions
(M-RoPE) of a sequence.

Why here, below both: the engine's prefill and the trainer's forward must place every token at the same
position, or the trainer's log-probs drift from the engine's. Positions are computed explicitly from the
ids and the image grids (never left to the model, which keeps `rope_deltas` as module state between calls
and would mix the rows of a continuous batch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# model_type of the vision-language families served here (their processors expand `<|image_pad|>`)
VISION_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl"})
# what a processor returns that the model's forward takes besides the ids (slime's multimodal_train_inputs)
TRAIN_INPUT_KEYS = ("pixel_values", "image_grid_thw")


def model_type(path: str | Path) -> str | None:
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return None
    return config.get("model_type") if isinstance(config, dict) else None


def is_vision_checkpoint(path: str | Path) -> bool:
    """The checkpoint has a vision tower (its config has a `vision_config`)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return False
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


def load_hf_model(path: str | Path, dtype: Any) -> Any:
    """The checkpoint's generation model: `AutoModelForImageTextToText` for a vision-language one (its
    language model, vision tower and head), else `AutoModelForCausalLM`."""
    if is_vision_checkpoint(path):
        from transformers import AutoModelForImageTextToText

        return AutoModelForImageTextToText.from_pretrained(str(path), dtype=dtype)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)


def is_vision_model(model: Any) -> bool:
    return getattr(getattr(model, "config", None), "vision_config", None) is not None


def image_token_id(model: Any) -> int:
    return int(model.config.image_token_id)


def tokens_per_image(image_grid_thw: Any, merge_size: int) -> list[int]:
    """How many `<|image_pad|>` tokens each image fills: its patches / merge_size²."""
    return [int(t) * int(h) * int(w) // (merge_size * merge_size) for t, h, w in image_grid_thw.tolist()]


def mrope_positions(model: Any, input_ids: Any, image_grid_thw: Any, attention_mask: Any = None) -> tuple[Any, Any]:
    """(position ids [3, B, L], delta per row [B]): the model's own M-RoPE index of each row, where a
    later text token at sequence index i sits at position i + delta (so a decode step feeds i + delta)."""
    import torch

    inner = model.model
    mm_types = (input_ids == image_token_id(model)).to(torch.int)
    positions, deltas = inner.get_rope_index(
        input_ids=input_ids, mm_token_type_ids=mm_types, image_grid_thw=image_grid_thw, attention_mask=attention_mask
    )
    return positions, deltas.reshape(-1)


def vision_forward_kwargs(model: Any, input_ids: Any, mm: dict[str, Any] | None, attention_mask: Any = None) -> dict:
    """What a forward of `model` over `input_ids` needs besides them: the pixel values, the image grids and
    the explicit M-RoPE position ids ({} for a text-only input)."""
    if not mm or mm.get("pixel_values") is None:
        return {}
    grid = mm["image_grid_thw"]
    positions, _ = mrope_positions(model, input_ids, grid, attention_mask)
    return {"pixel_values": mm["pixel_values"], "image_grid_thw": grid, "position_ids": positions}
