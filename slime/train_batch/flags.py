"""The flags of the train-batch split (`rank_batches`, `flops`) as one frozen config, `TrainBatchConfig`.

Why: the split runs in the rollout controller on every rollout a trainer takes; its flags are read once there
(issue #33) and handed down, so nothing in `slime.train_batch` reads `args`. slime's `build_dp_schedule(args, ...)`
(`slime.utils.dp_schedule`) reads the same config from the namespace slime's callers give it.

Every field is a flag upstream slime or Megatron-LM declares (the parser registers them from
`slime/cli/upstream_flags.json` with upstream's defaults; `--global-batch-size` is the rollout's), so no field
has a default: the parser's are the only ones. `from_args` does what `slime.utils.flag_config.ParsedConfig`'s
does, `args.<field>` with no fallback, without its base class: this package is the bottom layer and imports
nothing of ours (`tests/test_layering.py`).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any


class _FromArgs:
    """`from_args(args)`: every field is `args.<field>`, no fallback (a missing flag is an AttributeError naming
    it); a field typed as another of these configs is that config, read from the same namespace."""

    @classmethod
    def from_args(cls, args: Any) -> Any:
        hints = typing.get_type_hints(cls)
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            part = hints[f.name]
            is_config = isinstance(part, type) and issubclass(part, _FromArgs)
            values[f.name] = part.from_args(args) if is_config else getattr(args, f.name)
        return cls(**values)


@dataclass(frozen=True)
class ModelShape(_FromArgs):
    """Megatron's model flags `FlopsModel` weighs a sequence by (`--balance-data`); the unset ones are read from
    `--hf-checkpoint`'s config.json."""

    hidden_size: int | None
    num_attention_heads: int | None
    num_query_groups: int | None  # read only with --group-query-attention, as Megatron does
    group_query_attention: bool
    kv_channels: int | None
    ffn_hidden_size: int | None
    num_layers: int | None
    vocab_size: int | None
    num_experts: int | None  # None: a dense model
    moe_layer_freq: int | list[int] | None
    moe_ffn_hidden_size: int | None
    moe_router_topk: int
    moe_shared_expert_intermediate_size: int | None
    hf_checkpoint: str | None


@dataclass(frozen=True)
class TrainBatchConfig(_FromArgs):
    """What one rollout's split into data-parallel rank batches reads (`split_for_data_parallel`)."""

    global_batch_size: int | None  # rollouts per training step; unset: the whole rollout is one step
    micro_batch_size: int
    use_dynamic_batch_size: bool
    max_tokens_per_gpu: int | None  # the token cap of a micro-batch with --use-dynamic-batch-size
    balance_data: bool  # ranks balanced by forward FLOPs (`model`), not tokens
    model: ModelShape
