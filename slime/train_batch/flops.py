"""Forward FLOPs of one sequence, the weight `--balance-data` balances data-parallel ranks by.

Same cost model as slime's `calculate_fwd_flops` (dense or MoE decoder, grouped-query attention,
causal attention counted at half): per layer `2sh(nd) + 4sh(gd)` for the QKV projections,
`2ns²d` for scores and values, `2sh²` for the output projection and `6shf` for a gated MLP, plus
`2shV` for the LM head; s = sequence length, h = hidden, n = heads, g = query groups, d = head
dim, f = FFN width (MoE: `f_expert * topk + f_shared`), V = vocab. It is `a*s + b*s²`, which is
why long samples weigh more than their token count says.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime.train_batch.flags import ModelShape

# flag (Megatron name) -> key of a HF config.json, used when the flag is unset
HF_KEYS = {
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "num_query_groups": "num_key_value_heads",
    "kv_channels": "head_dim",
    "ffn_hidden_size": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "vocab_size": "vocab_size",
}


class FlopsModelError(ValueError):
    """The model's shape is unknown (no flags, no --hf-checkpoint config)."""


@dataclass(frozen=True)
class FlopsModel:
    linear: float  # FLOPs per token
    quadratic: float  # FLOPs per token², from attention

    def __call__(self, seqlen: int) -> float:
        return self.linear * seqlen + self.quadratic * seqlen * seqlen

    @classmethod
    def of(cls, shape: ModelShape) -> "FlopsModel":
        """The cost model of `shape` (its unset dimensions read from its checkpoint's config.json)."""
        dims = _model_dims(shape)
        h, n, layers = dims["hidden_size"], dims["num_attention_heads"], dims["num_layers"]
        g = dims.get("num_query_groups") or n
        d = dims.get("kv_channels") or h // n
        dense_layers, moe_layers, moe_ffn = _layer_split(shape, layers)
        attention_linear = 2 * h * n * d + 4 * h * g * d + 2 * h * h

        def mlp(ffn: float) -> float:
            return 6 * h * ffn

        linear = (
            dense_layers * (attention_linear + mlp(dims["ffn_hidden_size"]))
            + moe_layers * (attention_linear + mlp(moe_ffn))
            + 2 * h * dims["vocab_size"]
        )
        return cls(linear=float(linear), quadratic=float(2 * n * d * layers))

    @classmethod
    def from_args(cls, args: Any) -> "FlopsModel":
        """The model of a namespace our parser made (or completed): its `ModelShape`, read once."""
        return cls.of(ModelShape.from_args(args))


def _model_dims(shape: ModelShape) -> dict[str, Any]:
    dims = {key: getattr(shape, key) for key in HF_KEYS}
    if not shape.group_query_attention:  # Megatron reads --num-query-groups only with --group-query-attention
        dims["num_query_groups"] = None
    missing = [
        k
        for k in ("hidden_size", "num_attention_heads", "num_layers", "ffn_hidden_size", "vocab_size")
        if dims[k] is None
    ]
    if missing:
        config = _hf_config(shape.hf_checkpoint, missing)
        for key in HF_KEYS:
            if dims[key] is None:
                dims[key] = config.get(HF_KEYS[key])
    return dims


def _hf_config(path: str | None, missing: list[str]) -> dict[str, Any]:
    config = Path(path) / "config.json" if path else None
    if config is None or not config.is_file():
        raise FlopsModelError(
            f"--balance-data weighs samples by FLOPs and needs the model's shape: set "
            f"{', '.join('--' + k.replace('_', '-') for k in missing)} or --hf-checkpoint "
            "(a directory with config.json)"
        )
    return json.loads(config.read_text())


def _layer_split(shape: ModelShape, layers: int) -> tuple[int, int, float]:
    """(dense layers, MoE layers, MoE FFN width per token)."""
    if shape.num_experts is None:
        return layers, 0, 0.0
    freq = shape.moe_layer_freq
    if isinstance(freq, (list, tuple)):
        moe = sum(1 for f in freq if f > 0)
    elif freq:
        moe = sum(1 for i in range(layers) if i % freq == 0)
    else:
        moe = layers
    width = shape.moe_ffn_hidden_size * shape.moe_router_topk + (shape.moe_shared_expert_intermediate_size or 0)
    return layers - moe, moe, float(width)
