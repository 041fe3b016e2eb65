"""The policy as the trainer runs it: an HF causal LM that returns, for the response tokens of a packed
micro-batch, the log-prob of each sampled token and the entropy of its distribution.

Why a wrapper module: DDP only synchronises gradients of computations that go through its
`forward`, and the log-probs must be computed inside it. Logits are formed only at the positions
that predict response tokens (not over the whole padded batch), which keeps the vocabulary-sized
tensors small. The distribution is `log_softmax(logits / temperature)` over the full vocabulary,
exactly what the embedded engine reports for each sampled token (before top-k/top-p truncation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from slime.utils.vision_model import TRAIN_INPUT_KEYS, vision_forward_kwargs


@dataclass
class PackedMicroBatch:
    """Right-padded token rows plus where each response token is predicted from."""

    input_ids: torch.Tensor  # [B, L] int64
    attention_mask: torch.Tensor  # [B, L] int64
    rows: torch.Tensor  # [T] row of each response token
    cols: torch.Tensor  # [T] position whose logits predict it (its position - 1)
    targets: torch.Tensor  # [T] the sampled token ids
    response_lengths: list[int]
    images: dict[str, torch.Tensor] = field(default_factory=dict)  # a VLM's pixel_values, image_grid_thw (rows' order)


def pack(
    tokens: list[torch.Tensor],
    response_lengths: list[int],
    pad_id: int = 0,
    images: list[dict[str, Any] | None] | None = None,
) -> PackedMicroBatch:
    """Samples (prompt + response ids) -> one right-padded batch. Right padding keeps every real
    token at its own position, so no position ids are needed (a VLM's M-RoPE positions are computed
    from the ids and image grids in the forward). `images`: each sample's multimodal_train_inputs
    (None: none); their pixel values and grids are concatenated in row order, as the model reads them."""
    length = max(int(t.numel()) for t in tokens)
    input_ids = torch.full((len(tokens), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(tokens), length), dtype=torch.long)
    rows, cols, targets = [], [], []
    for i, (t, r) in enumerate(zip(tokens, response_lengths)):
        n = int(t.numel())
        if r < 0 or (r > 0 and r > n - 1):
            raise ValueError(f"sample {i}: response_length {r} with {n} tokens (a response needs a prompt token)")
        input_ids[i, :n] = t
        mask[i, :n] = 1
        rows.append(torch.full((r,), i, dtype=torch.long))
        cols.append(torch.arange(n - r - 1, n - 1, dtype=torch.long))
        targets.append(t[n - r :].to(torch.long))
    return PackedMicroBatch(
        input_ids,
        mask,
        torch.cat(rows),
        torch.cat(cols),
        torch.cat(targets),
        list(response_lengths),
        _concat_images(images or []),
    )


def _concat_images(per_sample: list[dict[str, Any] | None]) -> dict[str, torch.Tensor]:
    present = [d for d in per_sample if d and d.get("pixel_values") is not None]
    if not present:
        return {}
    return {key: torch.cat([torch.as_tensor(d[key]) for d in present], dim=0) for key in TRAIN_INPUT_KEYS}


class PolicyModel(torch.nn.Module):
    def __init__(self, hf_model: torch.nn.Module, temperature: float = 1.0):
        super().__init__()
        self.hf = hf_model
        self.temperature = float(temperature) if temperature and temperature > 0 else 1.0

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        rows: torch.Tensor,
        cols: torch.Tensor,
        targets: torch.Tensor,
        with_entropy: bool = True,
        with_logits: bool = False,
        pixel_values: torch.Tensor | None = None,
        image_grid_thw: torch.Tensor | None = None,
    ) -> tuple[Any, ...]:
        """(log-probs, entropy or None), plus the raw logits `[T, vocab]` at the positions predicting the
        response tokens with `with_logits` (what `--custom-loss-function-path` is given). With images (a
        vision-language model): the whole model's forward over the pixel values at the engine's M-RoPE
        positions (`slime.utils.vision_model`), so the log-probs are the ones the engine sampled with."""
        if pixel_values is not None:
            images = {"pixel_values": pixel_values, "image_grid_thw": image_grid_thw}
            hidden = self.hf.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                use_cache=False,
                **vision_forward_kwargs(self.hf, input_ids, images, attention_mask),
            ).last_hidden_state
        else:
            hidden = self.hf.get_decoder()(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False
            ).last_hidden_state
        logits = self.hf.get_output_embeddings()(hidden[rows, cols]).float()
        log_dist = torch.log_softmax(logits / self.temperature, dim=-1)
        log_probs = log_dist.gather(-1, targets[:, None]).squeeze(-1)
        entropy = -(log_dist.exp() * log_dist).sum(-1) if with_entropy else None
        return (log_probs, entropy, logits) if with_logits else (log_probs, entropy)

    def run(self, mb: PackedMicroBatch, with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self(mb.input_ids, mb.attention_mask, mb.rows, mb.cols, mb.targets, with_entropy, **mb.images)
