"""The embedded engine's own forward for dense decoder checkpoints (Llama, Qwen2, Qwen3 without sliding windows).

Why not transformers' modeling classes: importing them pulls in `torch._dynamo`, `torch.distributed.tensor` and
sympy through transformers' kernel and sharding integrations, ~1.8 CPU seconds of the engine fork server's
preload, which every cold start waits for. This module needs only torch and the checkpoint's `config.json`.

It computes what transformers' classes compute (same parameter names, the same ops in the same order, the same
SDPA calls), so the engine's log-probs stay the trainer's: `tests/test_decoder_lm.py` compares the two on every
family served. A checkpoint outside what is checked here (another family, a sliding window, scaled RoPE, remote
code, weights not in safetensors) is loaded by transformers, as before (`unsupported`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

FAMILIES = frozenset({"llama", "qwen2", "qwen3"})


def unsupported(config: dict[str, Any]) -> str | None:
    """Why `config` (a `config.json`) is not served by `DecoderLM`, or None when it is."""
    family = config.get("model_type")
    if family not in FAMILIES:
        return f"model_type {family!r} (served here: {', '.join(sorted(FAMILIES))})"
    if config.get("auto_map"):
        return "remote code (auto_map)"
    if config.get("hidden_act", "silu") != "silu":
        return f"hidden_act {config.get('hidden_act')!r}"
    if int(config.get("pretraining_tp", 1) or 1) != 1:
        return "pretraining_tp != 1"
    rope = rope_parameters(config)
    if rope.get("rope_type", "default") != "default":
        return f"rope_type {rope.get('rope_type')!r}"
    if "rope_theta" not in rope:
        return "no rope_theta"
    layer_types = config.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types) or (config.get("use_sliding_window") and not layer_types):
        return "sliding-window attention"
    return None


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """RoPE's parameters: transformers 5 writes `rope_parameters`, earlier checkpoints `rope_theta` and `rope_scaling`."""
    if isinstance(config.get("rope_parameters"), dict):
        return config["rope_parameters"]
    scaling = config.get("rope_scaling") or {}
    params = {"rope_type": scaling.get("rope_type", scaling.get("type", "default"))}
    if "rope_theta" in config:
        params["rope_theta"] = config["rope_theta"]
    return params


@dataclass
class CausalLMOutput:
    logits: torch.Tensor
    past_key_values: "KVCache | None"


class KVLayer:
    """One layer's keys and values [B, kv_heads, T, head_dim] (the fields `RunningBatch` pads and slices)."""

    __slots__ = ("keys", "values")

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def update(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = torch.cat([self.keys, keys], dim=-2)
            self.values = torch.cat([self.values, values], dim=-2)
        return self.keys, self.values


class KVCache:
    """Every layer's `KVLayer`; grows by concatenation, as transformers' `DynamicCache` does."""

    def __init__(self, num_layers: int) -> None:
        self.layers = [KVLayer() for _ in range(num_layers)]

    def get_seq_length(self) -> int:
        keys = self.layers[0].keys if self.layers else None
        return 0 if keys is None else int(keys.shape[-2])


class Linear(nn.Linear):
    def reset_parameters(self) -> None:
        """Nothing to draw: every weight comes from the checkpoint (and torch's random init on the meta device
        imports `torch._dynamo`, the very import this module exists to avoid)."""


class Embedding(nn.Embedding):
    def reset_parameters(self) -> None:
        """As `Linear.reset_parameters`."""


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class MLP(nn.Module):
    def __init__(self, hidden: int, inner: int, bias: bool) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden, inner, bias=bias)
        self.up_proj = Linear(hidden, inner, bias=bias)
        self.down_proj = Linear(inner, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    def __init__(self, cfg: SimpleNamespace, layer: int) -> None:
        super().__init__()
        self.layer, self.head_dim = layer, cfg.head_dim
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.groups = self.heads // self.kv_heads
        self.scaling = self.head_dim**-0.5
        hidden, qkv_bias, o_bias = cfg.hidden_size, cfg.qkv_bias, cfg.o_bias
        self.q_proj = Linear(hidden, self.heads * self.head_dim, bias=qkv_bias)
        self.k_proj = Linear(hidden, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = Linear(hidden, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = Linear(self.heads * self.head_dim, hidden, bias=o_bias)
        if cfg.qk_norm:  # Qwen3: RMSNorm over each head before RoPE
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None, cache):
        b, t = x.shape[:2]
        shape = (b, t, -1, self.head_dim)
        q, k = self.q_proj(x).view(shape), self.k_proj(x).view(shape)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), self.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if cache is not None:
            k, v = cache.layers[self.layer].update(k, v)
        if self.groups > 1 and mask is not None and t == 1:
            # one query token under a padding mask: the query heads of a key/value head become its rows, so
            # attention runs on the key/value heads as stored (transformers' `pack_gqa`)
            q = q.reshape(b, self.kv_heads, self.groups, self.head_dim)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)
        else:
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                scale=self.scaling,
                is_causal=t > 1 and mask is None,
                enable_gqa=self.groups > 1,
            )
        out = out.reshape(out.shape[0], -1, t, self.head_dim).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: SimpleNamespace, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderBody(nn.Module):
    """What transformers calls `model.model`: embeddings, layers, final norm (the checkpoint's `model.` names)."""

    def __init__(self, cfg: SimpleNamespace) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DecoderLM(nn.Module):
    """`forward(input_ids, attention_mask, position_ids, past_key_values, use_cache, logits_to_keep)` as the
    engine calls transformers' `*ForCausalLM`: a solo prefill (no mask, positions from 0) or a left-padded
    batch's decode step (a [B, T] padding mask and explicit positions)."""

    def __init__(self, cfg: SimpleNamespace, config: dict[str, Any], generation: dict[str, Any]) -> None:
        super().__init__()
        self.cfg = cfg
        self.config = SimpleNamespace(**config)
        self.generation_config = SimpleNamespace(**generation)
        self.model = DecoderBody(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # kept out of the module's tensors (as transformers' non-persistent buffer is): float32 whatever the dtype,
        # on the CPU even while the module is built on the meta device
        dims = torch.arange(0, cfg.head_dim, 2, dtype=torch.float, device="cpu")
        self.inv_freq = 1.0 / (cfg.rope_theta ** (dims / cfg.head_dim))

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
        logits_to_keep: int = 0,
    ) -> CausalLMOutput:
        cache = past_key_values
        if use_cache and cache is None:
            cache = KVCache(self.cfg.num_hidden_layers)
        x = self.model.embed_tokens(input_ids)
        t = x.shape[1]
        if position_ids is None:
            start = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(t) + start).unsqueeze(0)
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        mask = padding_mask(attention_mask, t)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, cache)
        x = self.model.norm(x)
        logits = self.lm_head(x[:, -logits_to_keep:, :] if logits_to_keep else x)
        return CausalLMOutput(logits=logits, past_key_values=cache if use_cache else None)


def padding_mask(attention_mask: torch.Tensor | None, t: int) -> torch.Tensor | None:
    """SDPA's boolean mask [B, 1, 1, T] for one query token over a left-padded cache; None without padding
    (SDPA's own causal mask then applies, as in transformers). A padded multi-token forward is not a call the
    engine makes."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    if t != 1:
        raise ValueError("DecoderLM: a padding mask is supported for one query token per row only")
    return attention_mask.bool()[:, None, None, :]


def model_config(config: dict[str, Any]) -> SimpleNamespace:
    """The shapes and switches of a supported `config.json` (transformers' defaults where a key is absent)."""
    family = config["model_type"]
    heads = int(config["num_attention_heads"])
    # where a family's default is not the obvious one (Qwen2 and Qwen3: 32 key/value heads; Qwen3: head_dim 128),
    # a field left out is transformers' to fill in
    if family != "llama" and config.get("num_key_value_heads") is None:
        raise KeyError("num_key_value_heads")
    if family == "qwen3" and config.get("head_dim") is None:
        raise KeyError("head_dim")
    head_dim = config.get("head_dim") or int(config["hidden_size"]) // heads
    return SimpleNamespace(
        vocab_size=int(config["vocab_size"]),
        hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]),
        num_hidden_layers=int(config["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope_parameters(config)["rope_theta"]),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        # Qwen2: q, k, v with bias, o without; Llama and Qwen3: `attention_bias` for all four
        qkv_bias=True if family == "qwen2" else bool(config.get("attention_bias", False)),
        o_bias=False if family == "qwen2" else bool(config.get("attention_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)) if family == "llama" else False,
        qk_norm=family == "qwen3",
    )


def load_decoder_lm(path: str | Path, dtype: torch.dtype) -> tuple[DecoderLM | None, str | None]:
    """(the checkpoint as a `DecoderLM` in `dtype`, None), or (None, why not) for transformers to load."""
    from safetensors.torch import load_file

    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, f"config.json: {exc}"
    if not isinstance(config, dict):
        return None, "config.json is not a JSON object"
    why = unsupported(config)
    if why:
        return None, why
    files = safetensors_files(path)
    if not files:
        return None, "no safetensors weights"
    try:
        generation = json.loads((path / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        generation = {}
    try:
        cfg = model_config(config)
    except (KeyError, TypeError, ValueError) as exc:  # a field missing or mistyped: transformers has its defaults
        return None, f"config.json: {type(exc).__name__}: {exc}"
    with torch.device("meta"):
        model = DecoderLM(cfg, config, generation)
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    tied = cfg.tie_word_embeddings
    if tied:
        state.pop("lm_head.weight", None)  # the embeddings serve as the head (transformers ties them too)
    expected = {k for k, _ in model.named_parameters() if not (tied and k == "lm_head.weight")}
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        return None, f"weights do not match the family's names (missing {missing[:3]}, unexpected {extra[:3]})"
    # the names are checked above; a tied head is the embeddings' own tensor, set after the load
    converted = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    model.load_state_dict(converted, assign=True, strict=not tied)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.eval()
    model.requires_grad_(False)
    return model, None


def safetensors_files(path: Path) -> list[Path]:
    """The checkpoint's safetensors files: the shards its index names, or `model.safetensors`."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError):
            return []
        return [path / n for n in names]
    single = path / "model.safetensors"
    return [single] if single.exists() else []
