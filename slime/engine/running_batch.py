"""The requests decoding together and their shared KV cache (a plain full-attention `DynamicCache`).

A request joins after its solo prefill: both caches are left-padded along the sequence axis to a
common length and concatenated along the batch axis. Each row keeps its own attention mask and
position ids, so padding never changes what a row attends to. Finished rows are dropped with
`index_select`, and leading columns that are padding for every remaining row are trimmed.
"""

from __future__ import annotations

from typing import Any

import torch

from slime.engine.request import Request


class RunningBatch:
    """Row i of every tensor belongs to `rows[i]`. Used by the decode thread only."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.rows: list[Request] = []
        self.cache = None  # DynamicCache for all rows, left-padded
        self.mask: torch.Tensor | None = None  # [B, T] 1 = real token
        self.next_pos: torch.Tensor | None = None  # [B] position id of the pending token
        self.pending: torch.Tensor | None = None  # [B] last sampled token, not yet in the cache

    def add(self, req: Request, cache: Any, length: int, token: int) -> None:
        """Merge a prefilled request (its cache of `length` prompt tokens, its first sampled `token`)."""
        mask = torch.ones(1, length, dtype=torch.long)
        pos = torch.tensor([length + req.position_delta])  # a VLM's image tokens shift later text positions
        tok = torch.tensor([token])
        if not self.rows:
            self.rows, self.cache, self.mask, self.next_pos, self.pending = [req], cache, mask, pos, tok
            return
        total = max(self.mask.shape[1], length)
        pad_old, pad_new = total - self.mask.shape[1], total - length
        for old_layer, new_layer in zip(self.cache.layers, cache.layers):
            for name in ("keys", "values"):
                a = left_pad(getattr(old_layer, name), pad_old, dim=2)
                b = left_pad(getattr(new_layer, name), pad_new, dim=2)
                setattr(old_layer, name, torch.cat([a, b], dim=0))
        self.mask = torch.cat([left_pad(self.mask, pad_old, dim=1), left_pad(mask, pad_new, dim=1)], dim=0)
        self.next_pos = torch.cat([self.next_pos, pos])
        self.pending = torch.cat([self.pending, tok])
        self.rows.append(req)

    def forward(self, model: Any) -> torch.Tensor:
        """One decode step of every row: feeds the pending tokens, returns the next-token logits [B, V]."""
        mask = torch.cat([self.mask, torch.ones(len(self.rows), 1, dtype=torch.long)], dim=1)
        out = model(
            input_ids=self.pending[:, None],
            attention_mask=mask,
            position_ids=self.next_pos[:, None],
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache, self.mask, self.next_pos = out.past_key_values, mask, self.next_pos + 1
        return out.logits[:, -1].float()

    def drop_finished(self) -> None:
        """Drop finished rows from the batch tensors and trim all-padding leading columns."""
        if not self.rows:
            return
        keep = [i for i, r in enumerate(self.rows) if not r.done]
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.clear()
            return
        idx = torch.tensor(keep)
        self.rows = [self.rows[i] for i in keep]
        self.mask, self.next_pos, self.pending = self.mask[idx], self.next_pos[idx], self.pending[idx]
        start = int(self.mask.any(dim=0).long().argmax())
        self.mask = self.mask[:, start:]
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, idx)[:, :, start:]
            layer.values = layer.values.index_select(0, idx)[:, :, start:]


def left_pad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n == 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)
