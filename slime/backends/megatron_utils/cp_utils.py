"""slime's context-parallel helpers as plugins call them (e.g. the `train_infer_mismatch_helper`
recipe's `compute_mis_weights_with_cp`). This trainer runs without context parallelism: every rank
holds each sample's whole response, so gathering and slicing are identities, as slime's are at a
context-parallel size of 1. The length checks stay, so a misaligned plugin still fails here."""

from __future__ import annotations

import torch


def all_gather_with_cp(tensor: torch.Tensor, total_length: int, response_length: int) -> torch.Tensor:
    """The whole response's values (this rank already holds all `response_length` of them)."""
    if tensor.shape[0] != response_length:
        raise ValueError(
            f"all_gather_with_cp: {tensor.shape[0]} values for a response of {response_length} tokens "
            f"(total length {total_length})"
        )
    return tensor


def slice_log_prob_with_cp(
    log_prob: list[float] | torch.Tensor, total_length: int, response_length: int
) -> list[float] | torch.Tensor:
    """This rank's share of a response's values: all of them."""
    if len(log_prob) != response_length:
        raise ValueError(
            f"log_prob length mismatch: len(log_prob)={len(log_prob)}, "
            f"response_length={response_length}, total_length={total_length}"
        )
    return log_prob
