"""Token-in, token-out calls to the engines through the router.

Every rollout function (single-turn, multi-turn, custom) sends `input_ids` and receives the
exact ids the engine sampled with their log-probs; nothing is re-tokenised. The per-process
`GenerateState` holds what all requests share: the router URL, the in-flight bound
(`--sglang-server-concurrency`), the tokenizer and the retry counters.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from dataclasses import dataclass, field
from typing import Any

from slime.utils.http_retry import HttpStats, RetryPolicy, post


@dataclass
class EngineOutput:
    token_ids: list[int]
    log_probs: list[float]
    text: str
    finish_type: str  # "stop" | "length" | "abort"
    matched: Any = None
    weight_version: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)


class GenerateState:
    """Process-wide state shared by all generate calls (created on first use)."""

    _instance: "GenerateState | None" = None

    def __init__(self, args: Any):
        self.args = args
        self.stats = HttpStats()
        self._semaphores: dict[int, asyncio.Semaphore] = {}
        self._tokenizer = None
        self._rid = itertools.count()
        self.in_flight = 0

    @classmethod
    def get(cls, args: Any) -> "GenerateState":
        if cls._instance is None or cls._instance.args is not args:
            cls._instance = cls(args)
        return cls._instance

    @property
    def router_url(self) -> str:
        return f"http://{self.args.sglang_router_ip}:{self.args.sglang_router_port}"

    @property
    def semaphore(self) -> asyncio.Semaphore:
        loop_id = id(asyncio.get_running_loop())
        sem = self._semaphores.get(loop_id)
        if sem is None:
            sem = self._semaphores[loop_id] = asyncio.Semaphore(max(1, int(self.args.sglang_server_concurrency)))
        return sem

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.args.hf_checkpoint)
        return self._tokenizer

    def new_rid(self) -> str:
        return f"slime-{os.getpid()}-{next(self._rid)}"


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=False)


def parse_generate_response(body: dict[str, Any]) -> EngineOutput:
    """Read ids and log-probs from `meta_info.output_token_logprobs` as slime does (item[1], item[0])."""
    meta = body.get("meta_info") or {}
    pairs = meta.get("output_token_logprobs")
    if pairs is not None:
        ids = [int(p[1]) for p in pairs]
        lps = [float(p[0]) for p in pairs]
    else:
        ids = [int(t) for t in body.get("output_ids") or []]
        lps = [0.0] * len(ids)
    finish = meta.get("finish_reason") or {}
    if isinstance(finish, str):
        finish = {"type": finish}
    return EngineOutput(ids, lps, body.get("text") or "", finish.get("type") or "stop", finish.get("matched"),
                        meta.get("weight_version"), body)


async def generate_tokens(args: Any, input_ids: list[int], sampling_params: dict[str, Any],
                          *, rid: str | None = None, url: str | None = None) -> EngineOutput:
    """One `/generate` call with log-probs, bounded by the in-flight semaphore and a deadline."""
    state = GenerateState.get(args)
    payload = {"input_ids": list(input_ids), "sampling_params": sampling_params, "return_logprob": True,
               "rid": rid or state.new_rid()}
    policy = RetryPolicy(max_retries=int(getattr(args, "request_max_retries", 8)))
    async with state.semaphore:
        state.in_flight += 1
        try:
            body = await post(url or f"{state.router_url}/generate", payload,
                              timeout=float(getattr(args, "request_timeout", 300.0)), policy=policy, stats=state.stats)
        finally:
            state.in_flight -= 1
    return parse_generate_response(body)
