"""Per-row sampling of the embedded engine: temperature (0 => greedy), top_k, top_p and a per-request
`torch.Generator` seeded by `sampling_seed`.

Draws use the exponential race (argmax p/E), so a seeded request gets the same tokens alone or batched.
The log-prob of a sampled token is log_softmax(logits / T)[token] from the raw model logits, BEFORE
top-k / top-p truncation and the min_new_tokens mask, with T = 1 when temperature is 0: what an RL
trainer recomputes with a teacher-forced forward pass, so the two compare directly.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy
import torch

_TOP_P_FIRST_TRY = 1024  # most likely tokens tried before sorting the whole vocabulary for a nucleus


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_new_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # accepted for compatibility; fast tokenizers ignore it
    no_stop_trim: bool = False
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0 or self.top_k == 1


def seeded_generator(seed: int | None) -> torch.Generator:
    """The request's own generator: `sampling_seed`, or fresh OS entropy when the request names none."""
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    return torch.Generator().manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)


def _scaled(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    return logits / params.temperature if params.temperature > 0 else logits


def sample_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None, banned: Collection[int] = ()
) -> int:
    """One token id from a row of vocabulary logits; `banned` ids (stop tokens before min_new_tokens) never win."""
    masked = _scaled(logits, params)
    if banned:
        masked = masked.clone()
        masked[[i for i in banned if 0 <= i < masked.shape[0]]] = float("-inf")
    if params.greedy:
        return int(torch.argmax(masked))
    if 0 < params.top_k < masked.shape[0]:
        kth = torch.topk(masked, params.top_k).values[-1]
        masked = masked.masked_fill(masked < kth, float("-inf"))
    probs = torch.softmax(masked, dim=-1)
    if params.top_p < 1.0:
        probs = probs.masked_fill(probs < top_p_threshold(probs, params.top_p), 0.0)
    # Exponential race: argmax(p_i / E_i), E_i ~ Exp(1), draws i with probability p_i. Unlike an
    # inverse-CDF draw, a 1e-7 change in the logits (batched vs solo kernels) almost never flips
    # the winner, so a seeded request samples the same tokens alone or in a batch.
    # -log U ~ Exp(1) (torch's exponential_ is ~6x slower than rand on CPU). U < 1, so the noise is
    # > 0 and p / noise is never NaN; U == 0 gives inf noise, i.e. that token simply loses.
    noise = torch.rand(probs.shape, generator=generator).log_().neg_()
    return int(torch.argmax(probs / noise))


def sampled_logprob(logits: torch.Tensor, params: SamplingParams, token: int) -> float:
    """log_softmax(logits / T)[token], T = 1 when greedy by temperature 0 (see the module docstring)."""
    return float(torch.log_softmax(_scaled(logits, params), dim=-1)[token])


def top_logprobs(logits: torch.Tensor, params: SamplingParams, k: int) -> list[tuple[float, int]]:
    """The k most likely (log-prob, id) under the same distribution as `sampled_logprob`, best first."""
    values, ids = torch.topk(torch.log_softmax(_scaled(logits, params), dim=-1), min(k, logits.shape[-1]))
    return [(float(v), int(i)) for v, i in zip(values, ids)]


def top_p_threshold(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Smallest probability kept by nucleus sampling: the top tokens whose mass first reaches top_p.

    Tries the 1024 most likely tokens first (enough for any peaked distribution) and only sorts
    the whole vocabulary for flat ones; a full torch.sort costs tens of ms per row on 2 cores.
    """
    k = min(_TOP_P_FIRST_TRY, probs.shape[0])
    top = torch.topk(probs, k).values
    csum = torch.cumsum(top, 0)
    if float(csum[-1]) < top_p and k < probs.shape[0]:
        top = torch.from_numpy(numpy.sort(probs.numpy())[::-1].copy())
        csum = torch.cumsum(top, 0)
    n = min(int(torch.searchsorted(csum, torch.tensor([top_p]))), top.shape[0] - 1)
    return top[n]
