"""SFT as a rollout function: conversations from the data source become training samples, no engine.

`--rollout-function-path slime.rollout.sft_rollout.generate_rollout` (slime's path and signature). Each
sample's prompt is a message list (`--input-key messages`); its tokens and loss mask come from
`MultiTurnLossMaskGenerator` with `--loss-mask-type` (default `qwen`), tools from `metadata["tools"]`.
The sample then holds `tokens` = the whole conversation, `response_length` = from the first trainable
token to the end, `loss_mask` over that response part, and reward 0, as slime's trainer expects.
"""

from __future__ import annotations

import logging
from typing import Any

from slime.utils.mask_utils import MultiTurnLossMaskGenerator
from slime.utils.processing_utils import load_tokenizer
from slime.utils.types import Sample
from slime.utils.plugin_args import completed

__all__ = ["generate_rollout"]

logger = logging.getLogger(__name__)


def _mask_generator(args: Any, runtime: Any) -> MultiTurnLossMaskGenerator:
    """One generator per runtime and mask type (the tokenizer is the runtime's, loaded once)."""
    mask_type = args.loss_mask_type
    if not args.hf_checkpoint:
        raise ValueError("slime.rollout.sft_rollout needs --hf-checkpoint (its tokenizer builds the loss masks)")
    if runtime is None:
        return MultiTurnLossMaskGenerator(load_tokenizer(args.hf_checkpoint, trust_remote_code=True), mask_type)
    return runtime.shared(
        f"sft_rollout.mask_generator.{mask_type}", lambda: MultiTurnLossMaskGenerator(runtime.tokenizer, mask_type)
    )


def _bound_runtime() -> Any:
    from slime.rollout import runtime as runtime_module

    try:
        return runtime_module.current()
    except RuntimeError:  # called by hand, outside a controller
        return None


def _messages(sample: Sample) -> list[dict]:
    messages = sample.prompt if isinstance(sample.prompt, list) else sample.metadata.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError(
            f"sft_rollout: sample {sample.index} has no message list as prompt "
            f"(got {type(sample.prompt).__name__}); point --input-key at the conversation's messages"
        )
    return messages


def build_sft_sample(sample: Sample, generator: MultiTurnLossMaskGenerator) -> Sample:
    """Fill `sample` (in place) with the conversation's tokens and the response part of its loss mask."""
    messages = _messages(sample)
    token_ids, loss_mask = generator.get_loss_mask(messages, tools=sample.metadata.get("tools"))
    if len(token_ids) != len(loss_mask):
        raise ValueError(
            f"SFT rollout produced mismatched token_ids/loss_mask lengths: "
            f"{len(token_ids)=}, {len(loss_mask)=} (sample {sample.index})"
        )
    response_length = generator.get_response_lengths([loss_mask])[0]
    sample.tokens = token_ids
    sample.response_length = response_length
    sample.loss_mask = loss_mask[len(loss_mask) - response_length :]
    sample.reward = 0
    return sample


def generate_rollout(args: Any, rollout_id: int, data_buffer: Any, evaluation: bool = False) -> list[list[Sample]]:
    """`--rollout-batch-size` groups from the data source, each sample tokenised with its loss mask."""
    args = completed(args)
    if evaluation:
        raise ValueError(
            "slime.rollout.sft_rollout cannot evaluate; set --eval-function-path to a generating "
            "rollout (e.g. slime.rollout.sglang_rollout.generate_rollout) or drop --eval-prompt-data"
        )
    if not args.rollout_global_dataset:
        raise ValueError("slime.rollout.sft_rollout reads the global dataset; drop --disable-rollout-global-dataset")
    generator = _mask_generator(args, _bound_runtime())
    groups = data_buffer.get_samples(args.rollout_batch_size)
    for group in groups:
        for sample in group:
            build_sft_sample(sample, generator)
    if groups and groups[0]:
        first = groups[0][0]
        logger.debug(
            "sft_rollout %d: first sample has %d tokens, %d response tokens, %d trainable",
            rollout_id,
            len(first.tokens),
            first.response_length,
            first.effective_response_length,
        )
    return groups
