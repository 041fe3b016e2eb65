"""In-place edits of the served model's tensors. The decode thread runs them between two decode steps,
so a step never sees half-updated weights; restarting the requests they affect is its job, not theirs."""

from __future__ import annotations

import os
from typing import Any

import torch

from slime.engine.request import EngineReleasedError


def served_tensors(model: Any) -> dict[str, torch.Tensor]:
    """Name -> tensor of the served model (SGLang's names), or EngineReleasedError while it is released."""
    from slime.weights.receive import model_tensors

    if model is None:
        raise EngineReleasedError("weights are released (release_memory_occupation)")
    return model_tensors(model)


def copy_tensors(table: dict[str, torch.Tensor], named: list[tuple[str, torch.Tensor]]) -> None:
    """Pushed tensors, already validated by the caller (the names, shapes and dtypes match)."""
    for name, t in named:
        table[name].copy_(t)


def randomize_tensors(table: dict[str, torch.Tensor], seed: int | None) -> None:
    """Every floating-point weight drawn from N(0, 1) (SGLang's `reset_tensors`: proves a later push
    rewrites everything); a tensor shared under two names is drawn once."""
    gen = torch.Generator().manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
    for t in {id(t): t for t in table.values()}.values():
        if t.is_floating_point():
            t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.dtype))


def tensor_checksums(table: dict[str, torch.Tensor]) -> dict[str, str]:
    """SHA-256 per tensor."""
    from slime.weights.transfer import tensor_checksum

    return {name: tensor_checksum(t) for name, t in table.items()}
