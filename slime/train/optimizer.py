"""The trainer's optimizer and learning-rate schedule, from Megatron's flags as slime passes them:
AdamW (`--lr`, `--adam-beta1`, `--adam-beta2`, `--adam-eps`, `--weight-decay`) and a linear warm-up over
`--lr-warmup-iters` steps, constant after it. One function, so a flag's effect is testable without a model."""

from __future__ import annotations

from typing import Iterable

import torch

from slime.train.flags import OptimizerConfig


def build_optimizer(
    params: Iterable[torch.nn.Parameter], config: OptimizerConfig
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    optimizer = torch.optim.AdamW(
        list(params),
        lr=float(config.lr),
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_eps,
        weight_decay=float(config.weight_decay or 0.0),
    )
    warmup = int(config.lr_warmup_iters or 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda it: min(1.0, (it + 1) / warmup) if warmup > 0 else 1.0
    )
    return optimizer, scheduler
