"""`EngineClient`: the one way rollout code talks to the engines, token-in and token-out.

Every rollout function (single-turn, multi-turn, custom) sends `input_ids` and gets back the
exact ids the engine sampled with their log-probs; nothing is re-tokenised. The client owns what
all requests of a controller share: where the router and engines are, the HTTP sessions, the
in-flight bound (`--sglang-server-concurrency`), the retry policy and its counters, the
tokenizer, and the controller's `Progress`, which it feeds as requests finish, so a custom
rollout function reports progress without doing anything.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import weakref
from dataclasses import dataclass, field
from typing import Any

from slime.fleet import sglang_payloads as payloads
from slime.rollout.progress import Progress
from slime.utils.endpoints import Endpoints, rollout_num_engines
from slime.utils.http_retry import HttpClient, HttpStats, RetryPolicy
from slime.utils.processing_utils import load_tokenizer

# seconds a failing request keeps being retried: a router restart (~1 s), an engine restart
# (model load), or a frozen engine the router marked unhealthy for a while (--request-retry-window)
DEFAULT_RETRY_WINDOW = 60.0


@dataclass
class EngineOutput:
    token_ids: list[int]
    log_probs: list[float]
    text: str
    finish_type: str  # "stop" | "length" | "abort"
    matched: Any = None
    weight_version: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)


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


class EngineClient:
    def __init__(self, endpoints: Endpoints, *, concurrency: int = 512, request_timeout: float = 300.0,
                 max_retries: int = 8, retry_window: float | None = DEFAULT_RETRY_WINDOW,
                 tokenizer_path: str | None = None, tokenizer: Any = None, progress: Progress | None = None):
        self.endpoints = endpoints
        self.concurrency = max(1, int(concurrency))
        self.request_timeout = float(request_timeout)
        # the budget is a time window (a brief outage of every engine is waited out), capped by a count
        self.retry_policy = RetryPolicy(max_retries=int(max_retries),
                                        window=None if retry_window is None else float(retry_window))
        self.stats = HttpStats()
        self.progress = progress if progress is not None else Progress()
        self.http = HttpClient()
        self.in_flight = 0
        self._tokenizer_path, self._tokenizer = tokenizer_path, tokenizer
        # asyncio primitives are loop-bound: one bound per loop, keyed by the loop object (weakly)
        self._bounds: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = \
            weakref.WeakKeyDictionary()
        self._rid = itertools.count()
        self._background: set[asyncio.Task] = set()  # rid aborts in flight (kept referenced until done)

    @classmethod
    def from_args(cls, args: Any, endpoints: Endpoints, **kw: Any) -> "EngineClient":
        # slime's bound: --sglang-server-concurrency per engine
        return cls(endpoints, concurrency=args.sglang_server_concurrency * max(1, rollout_num_engines(args)),
                   request_timeout=getattr(args, "request_timeout", 300.0),
                   max_retries=getattr(args, "request_max_retries", 8),
                   retry_window=getattr(args, "request_retry_window", DEFAULT_RETRY_WINDOW),
                   tokenizer_path=getattr(args, "hf_checkpoint", None), **kw)

    @property
    def router_url(self) -> str:
        if not self.endpoints.router_url:
            raise RuntimeError("no router: this client was created without engines (--load-debug-rollout-data?)")
        return self.endpoints.router_url

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            if not self._tokenizer_path:
                raise RuntimeError("no tokenizer: --hf-checkpoint is not set")
            self._tokenizer = load_tokenizer(self._tokenizer_path)
        return self._tokenizer

    @property
    def semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._bounds.get(loop)
        if sem is None:
            sem = self._bounds[loop] = asyncio.Semaphore(self.concurrency)
        return sem

    def new_rid(self) -> str:
        return f"slime-{os.getpid()}-{next(self._rid)}"

    async def post(self, url: str, payload: Any, *, timeout: float | None = None,
                   policy: RetryPolicy | None = None, headers: dict[str, str] | None = None,
                   on_retry: Any = None) -> Any:
        """Any JSON POST, with this client's deadline, retry budget and counters."""
        return await self.http.post(url, payload, timeout=timeout or self.request_timeout,
                                    policy=policy or self.retry_policy, stats=self.stats, headers=headers,
                                    on_retry=on_retry)

    def _renew_rid(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A retried request gets a fresh `rid`; the old one is aborted in case an engine still runs
        it (a timed-out or router-orphaned request would otherwise answer `400 rid already in flight`
        and keep the engine busy)."""
        old = payload["rid"]
        task = asyncio.ensure_future(self._abort_rid(old))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return {**payload, "rid": self.new_rid()}

    async def _abort_rid(self, rid: str) -> None:
        once = RetryPolicy(max_retries=0)
        await asyncio.gather(*(self.http.post(f"{u}/abort_request", payloads.abort_request(rid=rid), timeout=10, policy=once)
                               for u in self.endpoints.engine_urls), return_exceptions=True)

    async def generate(self, input_ids: list[int], sampling_params: dict[str, Any], *, rid: str | None = None,
                       url: str | None = None) -> EngineOutput:
        """One `/generate` with log-probs, bounded by the in-flight semaphore and a deadline."""
        payload = payloads.generate(input_ids, sampling_params, rid=rid or self.new_rid())
        async with self.semaphore:
            self.in_flight += 1
            try:
                body = await self.post(url or f"{self.router_url}/generate", payload, on_retry=self._renew_rid)
            finally:
                self.in_flight -= 1
        out = parse_generate_response(body)
        self.progress.on_response(len(out.token_ids))
        return out

    async def abort_all(self) -> None:
        """Abort every in-flight request on every engine (the router does not proxy abort)."""
        once = RetryPolicy(max_retries=0)
        await asyncio.gather(*(self.http.post(f"{u}/abort_request", payloads.abort_request(abort_all=True), timeout=10,
                                              policy=once)
                               for u in self.endpoints.engine_urls), return_exceptions=True)

    async def close(self) -> None:
        await self.http.close()
