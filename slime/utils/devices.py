"""Whether this process sees a CUDA device: decides `--rollout-backend auto` wherever it is resolved."""

from __future__ import annotations


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - a broken or absent torch means no CUDA here, not an error
        return False
