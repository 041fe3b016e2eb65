"""One micro-batch -> a packed THD batch for Megatron (`PackedSeqParams`, `qkv_format="thd"`).

The sequences of a micro-batch are concatenated into one row (no padding between samples, so no
compute is wasted on pad tokens); attention is kept within each sequence by `cu_seqlens`. This is the
layout slime's `get_batch` builds, done on CPU with megatron-core's own type, so it can be checked
without a GPU (megatron-core imports without CUDA; only its model forward needs one).

Conventions (slime's):
* `position_ids` restart at 0 for every sequence (and for the trailing pad segment).
* Per-token training values sit at the position whose logits predict the token: the value of
  response token j of a sequence with prompt length P is at offset `P - 1 + j` of that sequence, the
  last position of every sequence is 0. So `loss_mask[t]` weights the loss of logits[t] against
  tokens[t + 1], as in slime (`F.pad(loss_mask, (P - 1, 1))`). A sequence therefore needs P >= 1.
* `seq_pad_multiple` pads every sequence (context parallelism splits each sequence in `2 * cp_size`
  chunks: pass `2 * cp_size`); `pad_multiple` pads the whole row (tensor parallelism with sequence
  parallel, and fragmentation: slime passes `tp_size * --data-pad-size-multiplier`). The row's padding
  is one more segment in `cu_seqlens` (so attention kernels see every token), as slime does.
* `cu_seqlens` are int32 offsets of the padded sequences; `max_seqlen` is over all segments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import warnings

import torch

with warnings.catch_warnings():  # megatron.core's __init__ warns about optional GPU kernels (TE, Apex) on CPU
    warnings.simplefilter("ignore", UserWarning)
    warnings.simplefilter("ignore", DeprecationWarning)
    from megatron.core.packed_seq_params import PackedSeqParams


class PackingError(ValueError):
    pass


@dataclass
class PackedMicroBatch:
    """Row tensors are `[1, T]`: `tokens`/`position_ids` int64, `loss_mask` int32, `rollout_log_probs`
    float32 (None when not given). `seq_lengths`: the unpadded sequence lengths, in order."""

    tokens: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    rollout_log_probs: torch.Tensor | None
    cu_seqlens: torch.Tensor
    max_seqlen: int
    seq_lengths: list[int]
    packed_seq_params: PackedSeqParams


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def pack_micro_batch(
    tokens: Sequence[Sequence[int] | torch.Tensor],
    response_lengths: Sequence[int],
    loss_masks: Sequence[Sequence[int] | torch.Tensor],
    rollout_log_probs: Sequence[Sequence[float] | torch.Tensor] | None = None,
    *,
    pad_multiple: int = 1,
    seq_pad_multiple: int = 1,
    pad_token_id: int = 0,
) -> PackedMicroBatch:
    """Pack one micro-batch (e.g. a rank batch's lists picked with one `micro_batch_indices` entry)."""
    if not tokens:
        raise PackingError("empty micro-batch")
    if (
        len(response_lengths) != len(tokens)
        or len(loss_masks) != len(tokens)
        or (rollout_log_probs is not None and len(rollout_log_probs) != len(tokens))
    ):
        raise PackingError(
            f"{len(tokens)} sequences but {len(response_lengths)} response_lengths, "
            f"{len(loss_masks)} loss_masks"
            + ("" if rollout_log_probs is None else f", {len(rollout_log_probs)} rollout_log_probs")
        )
    if pad_multiple < 1 or seq_pad_multiple < 1:
        raise PackingError(f"pad_multiple={pad_multiple} and seq_pad_multiple={seq_pad_multiple} must be >= 1")
    seqs = [torch.as_tensor(t, dtype=torch.int64).reshape(-1) for t in tokens]
    lengths = [int(s.numel()) for s in seqs]
    padded = [_round_up(n, seq_pad_multiple) for n in lengths]
    body = sum(padded)
    total = _round_up(body, pad_multiple)

    row = torch.full((total,), pad_token_id, dtype=torch.int64)
    positions = torch.empty(total, dtype=torch.int64)
    mask = torch.zeros(total, dtype=torch.int32)
    logp = torch.zeros(total, dtype=torch.float32) if rollout_log_probs is not None else None
    bounds = [0]
    for i, (seq, n, p, r) in enumerate(zip(seqs, lengths, padded, response_lengths)):
        start = bounds[-1]
        prompt = n - r
        if r < 0 or prompt < 1:
            raise PackingError(
                f"sequence {i}: {n} tokens with response_length {r}; packing needs a prompt "
                "of at least one token (its logits predict the first response token)"
            )
        m = torch.as_tensor(loss_masks[i], dtype=torch.int32).reshape(-1)
        if m.numel() != r:
            raise PackingError(f"sequence {i}: loss_mask has {m.numel()} entries, response_length is {r}")
        row[start : start + n] = seq
        positions[start : start + p] = torch.arange(p)
        first = start + prompt - 1  # logits here predict the first response token
        mask[first : first + r] = m
        if logp is not None:
            lp = torch.as_tensor(rollout_log_probs[i], dtype=torch.float32).reshape(-1)
            if lp.numel() != r:
                raise PackingError(f"sequence {i}: rollout_log_probs has {lp.numel()} entries, response_length is {r}")
            logp[first : first + r] = lp
        bounds.append(start + p)
    if total > body:  # the row's padding: a segment of its own
        positions[body:] = torch.arange(total - body)
        bounds.append(total)
    cu_seqlens = torch.tensor(bounds, dtype=torch.int32)
    max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    params = PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_seqlens,
        max_seqlen_q=max_seqlen,
        max_seqlen_kv=max_seqlen,
    )
    return PackedMicroBatch(
        tokens=row.unsqueeze(0),
        position_ids=positions.unsqueeze(0),
        loss_mask=mask.unsqueeze(0),
        rollout_log_probs=None if logp is None else logp.unsqueeze(0),
        cu_seqlens=cu_seqlens,
        max_seqlen=max_seqlen,
        seq_lengths=lengths,
        packed_seq_params=params,
    )


def unpack_micro_batch(packed: PackedMicroBatch, response_lengths: Sequence[int]) -> dict[str, list[torch.Tensor]]:
    """Inverse of `pack_micro_batch`: per sequence `tokens`, `loss_masks` and (when packed)
    `rollout_log_probs`, read back through `cu_seqlens` (a check that the packing is lossless)."""
    out: dict[str, list[torch.Tensor]] = {"tokens": [], "loss_masks": []}
    if packed.rollout_log_probs is not None:
        out["rollout_log_probs"] = []
    starts = packed.cu_seqlens.tolist()
    for i, (n, r) in enumerate(zip(packed.seq_lengths, response_lengths)):
        start = starts[i]
        first = start + n - r - 1
        out["tokens"].append(packed.tokens[0, start : start + n].clone())
        out["loss_masks"].append(packed.loss_mask[0, first : first + r].clone())
        if packed.rollout_log_probs is not None:
            out["rollout_log_probs"].append(packed.rollout_log_probs[0, first : first + r].clone())
    return out
