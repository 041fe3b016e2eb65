"""`EngineClient`: the one way rollout code talks to the engines, token-in and token-out.

Every rollout function (single-turn, multi-turn, custom) sends `input_ids` and gets back the
exact ids the engine sampled with their log-probs; nothing is re-tokenised. The client owns what
all requests of a controller share: where the router and engines are, the HTTP sessions, the
in-flight bound (`--sglang-server-concurrency`), the retry policy and its counters, the
tokenizer, and the controller's `Progress`, which it feeds as requests finish, so a custom
rollout function reports progress without doing anything.

Aborting is the client's job too, because only it sees every request: while `gate` is closed
(a rollout aborting its leftovers, the fully-async worker pausing for a weight update) no request
leaves the process — one still waiting for an in-flight slot answers "abort" with no tokens — and
`abort_until_settled` re-sends the engines' `abort_all` until the given tasks finish, since a
request on its way through the router when the first abort arrives is not yet on any engine.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from slime.fleet import sglang_payloads as payloads
from slime.rollout.progress import Progress
from slime.utils.endpoints import Endpoints, rollout_num_engines
from slime.utils.http_retry import HttpClient, HttpError, HttpStats, RetryPolicy, request_json
from slime.utils.per_loop import PerLoop
from slime.utils.processing_utils import load_tokenizer

logger = logging.getLogger(__name__)

# seconds a failing request keeps being retried: a router restart (~1 s), an engine restart
# (model load), or a frozen engine the router marked unhealthy for a while (--request-retry-window)
DEFAULT_RETRY_WINDOW = 60.0


ABORT_RESEND_FIRST = 0.05  # seconds before the first re-sent abort_all; doubles each time
CLOSE_TIMEOUT = 10.0  # seconds `close` waits for background rid aborts (each is one request of 10 s at most)


class AbortGate:
    """Closed while requests are being aborted: no new engine request may start."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def open(self) -> None:
        self.closed = False


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
        # asyncio primitives are loop-bound: one bound per event loop
        self._bounds: PerLoop[asyncio.Semaphore] = PerLoop(lambda: asyncio.Semaphore(self.concurrency))
        self._rid_prefix, self._rid = f"slime-{os.getpid()}-", itertools.count()
        self._background: set[asyncio.Task] = set()  # rid aborts in flight (kept referenced until done)
        self.gate = AbortGate()

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
        """The in-flight bound of the running event loop."""
        return self._bounds.get()

    def new_rid(self) -> str:
        return f"{self._rid_prefix}{next(self._rid)}"

    async def post(self, url: str, payload: Any, *, timeout: float | None = None,
                   policy: RetryPolicy | None = None, headers: dict[str, str] | None = None,
                   on_retry: Any = None) -> Any:
        """Any JSON POST, with this client's deadline, retry budget and counters."""
        return await request_json("POST", url, payload, session=self.http.session(),
                                  timeout=timeout or self.request_timeout, policy=policy or self.retry_policy,
                                  stats=self.stats, headers=headers, on_retry=on_retry)

    def _renew_rid(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A retried request gets a fresh `rid`; the old one is aborted in case an engine still runs
        it (a timed-out or router-orphaned request would otherwise answer `400 rid already in flight`
        and keep the engine busy)."""
        old = payload["rid"]
        task = asyncio.ensure_future(self._abort_rid(old))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return {**payload, "rid": self.new_rid()}

    async def engine_urls(self) -> list[str]:
        """Where aborts go (the router does not proxy them): the fleet's engines; with no fleet bound
        (a plugin driving rollouts against --sglang-router-ip/--sglang-router-port), the router's
        workers, asked each time (`GET /workers`, as slime does)."""
        if self.endpoints.engine_urls or not self.endpoints.router_url:
            return list(self.endpoints.engine_urls)
        try:
            body = await self.http.get(f"{self.router_url}/workers", timeout=10, policy=RetryPolicy(max_retries=0),
                                       stats=self.stats)
        except HttpError as e:
            logger.warning("abort: cannot list the router's workers (%s); nothing aborted", e)
            return []
        workers = body.get("workers", []) if isinstance(body, dict) else body
        return [w["url"] for w in workers or [] if isinstance(w, dict) and w.get("url")]

    async def _abort_rid(self, rid: str) -> None:
        once = RetryPolicy(max_retries=0)
        await asyncio.gather(*(self.http.post(f"{u}/abort_request", payloads.abort_request(rid=rid), timeout=10, policy=once)
                               for u in await self.engine_urls()), return_exceptions=True)

    async def generate(self, input_ids: list[int], sampling_params: dict[str, Any], *, rid: str | None = None,
                       url: str | None = None) -> EngineOutput:
        """One `/generate` with log-probs, bounded by the in-flight semaphore and a deadline."""
        payload = payloads.generate(input_ids, sampling_params, rid=rid or self.new_rid())
        async with self.semaphore:
            if self.gate.closed:  # aborted while waiting for a slot: never sent, nothing sampled
                return EngineOutput([], [], "", "abort")
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
                               for u in await self.engine_urls()), return_exceptions=True)

    async def abort_until_settled(self, tasks: "set[asyncio.Future] | list[asyncio.Future]",
                                  timeout: float | None) -> tuple[set, set]:
        """`abort_all`, re-sent (50 ms, doubling) while any of `tasks` runs, for at most `timeout`
        seconds; returns (done, still running). The caller closes `gate` first and decides what
        to do with the tasks still running."""
        pending = set(tasks)
        done: set = set()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        wait = ABORT_RESEND_FIRST
        while True:
            await self.abort_all()
            if not pending:
                return done, pending
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return done, pending
            finished, pending = await asyncio.wait(pending, timeout=wait if left is None else min(wait, left))
            done |= finished
            if not pending:
                return done, pending
            wait *= 2

    async def close(self) -> None:
        """Close the running loop's HTTP session, after this client's background rid aborts on that
        loop (at most `CLOSE_TIMEOUT` seconds, then cancelled): one still running would open a new
        session after this one closed, and that one would never be closed."""
        loop = asyncio.get_running_loop()
        mine = {t for t in self._background if t.get_loop() is loop}
        if mine:
            _, late = await asyncio.wait(mine, timeout=CLOSE_TIMEOUT)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await self.http.close()
