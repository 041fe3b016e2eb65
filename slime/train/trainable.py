"""slime's `--only-train-params-name-list` and `--freeze-params-name-list`: which parameters the
optimizer updates, chosen by `re.search` of each pattern on the parameter's name, as slime does.

The trainer here holds a Hugging Face model, whose names (`model.layers.0.self_attn.q_proj.weight`)
are not Megatron's (`decoder.layers.0.self_attention.linear_qkv.weight`): a pattern written for
Megatron would match nothing and, silently, train everything or nothing. So a pattern that matches no
parameter is refused, named, with some of the names it could have matched."""

from __future__ import annotations

import re
import torch

from slime.train.flags import OptimizerConfig


class TrainableParamsError(ValueError):
    """A freeze pattern that matches no parameter of the model (the message names the flag)."""


def apply_trainable_patterns(model: torch.nn.Module, config: OptimizerConfig) -> list[str]:
    """Sets `requires_grad` by the flags; returns the names left trainable."""
    only, freeze = config.only_train_params_name_list, config.freeze_params_name_list
    names = [name for name, _ in model.named_parameters()]
    for flag, patterns in (("--only-train-params-name-list", only), ("--freeze-params-name-list", freeze)):
        for pattern in patterns or []:
            if not any(re.search(pattern, name) for name in names):
                raise TrainableParamsError(
                    f"{flag} {pattern!r} matches no parameter of the model (its names are the Hugging Face "
                    f"checkpoint's, not Megatron's; e.g. {', '.join(names[:3])})"
                )
    for name, param in model.named_parameters():
        if only:
            param.requires_grad_(any(re.search(p, name) for p in only))
        if freeze and any(re.search(p, name) for p in freeze):
            param.requires_grad_(False)
    trainable = [name for name, param in model.named_parameters() if param.requires_grad]
    if not trainable:
        raise TrainableParamsError(f"--freeze-params-name-list {freeze}: every parameter is frozen")
    return trainable
