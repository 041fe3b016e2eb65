"""Loading the served checkpoint: the inference-only model, its end-of-sequence ids, and the copy a warm
start preloads before the engine processes are forked."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)


def load_model(path: str, dtype: torch.dtype):
    """The checkpoint as an inference-only module (eval mode, no grads): a dense decoder family by the
    engine's own forward (`slime.engine.decoder_lm`), anything else by transformers, a vision-language
    checkpoint with its vision tower (`slime.utils.vision_model.load_hf_model`)."""
    from slime.engine.decoder_lm import load_decoder_lm
    from slime.utils.vision_model import load_hf_model

    model, why = load_decoder_lm(path, dtype)
    if model is not None:
        return model
    logger.info("%s: loaded by transformers (%s)", path, why)
    model = load_hf_model(path, dtype)
    model.eval()
    model.requires_grad_(False)
    return model


def eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """Every id the config, the generation config or the tokenizer names as end of sequence."""
    ids: set[int] = set()
    for src in (
        model.config.eos_token_id,
        getattr(model.generation_config, "eos_token_id", None),
        tokenizer.eos_token_id,
    ):
        if isinstance(src, int):
            ids.add(src)
        elif src:
            ids.update(int(i) for i in src)
    return frozenset(ids)


@dataclass
class PreloadedModel:
    """A checkpoint loaded once before the engine processes exist (slime.engine.warm_start): each
    engine forked from that process starts with it, sharing the pages until it writes its own."""

    model_path: str
    dtype: torch.dtype
    model: Any
    tokenizer: Any  # the decode thread's
    server_tokenizer: Any  # the HTTP handlers' own instance (a tokenizer is not shared across threads)

    def matches(self, model_path: str, dtype: torch.dtype) -> bool:
        return os.path.realpath(model_path) == os.path.realpath(self.model_path) and dtype == self.dtype
