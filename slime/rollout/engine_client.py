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

Every answer is checked (`engine_answer`): a bad one is retried like a 5xx. A retried request's
old `rid` needs aborting only when no answer came back for it (timeout, connection lost): an
answer, even an error, means no engine still runs it. Without an answer the abort goes where the
request was and nowhere else (`_renew_rid`), so a retry costs at most one request, at any fleet size.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

from slime.rollout.defaults import REQUEST_MAX_RETRIES
from slime.fleet import sglang_payloads as payloads
from slime.fleet.router_answer import parse_workers
from slime.rollout.flags import RolloutRunConfig
from slime.rollout.engine_answer import EngineOutput, parse_generate_answer, router_fault
from slime.rollout.progress import Progress
from slime.utils.endpoints import Endpoints, rollout_num_engines
from slime.utils.http_retry import Failure, HttpClient, HttpError, HttpStats, RetryPolicy, request_json
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


def parse_generate_response(
    body: Any, *, vocab_size: int | None = None, max_new_tokens: int | None = None
) -> EngineOutput:
    """The checked answer (kept under its old name for callers of this module): see `engine_answer`."""
    return parse_generate_answer(body, vocab_size=vocab_size, max_new_tokens=max_new_tokens)


def model_vocab_size(path: str | None) -> int | None:
    """`vocab_size` from the model's `config.json` (the embedding's rows, often above the tokenizer's
    length), or None when there is no readable config."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, TypeError, ValueError):
        return None
    text = config.get("text_config") if isinstance(config, dict) else None
    size = config.get("vocab_size") if isinstance(config, dict) else None
    size = size or (text.get("vocab_size") if isinstance(text, dict) else None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _no_body(raw: bytes) -> None:
    """Control answers (`/abort_request`) carry nothing to read: the status is the answer."""


class EngineClient:
    def __init__(
        self,
        endpoints: Endpoints,
        *,
        concurrency: int = 512,
        request_timeout: float = 300.0,
        max_retries: int = REQUEST_MAX_RETRIES,
        retry_window: float | None = DEFAULT_RETRY_WINDOW,
        tokenizer_path: str | None = None,
        tokenizer: Any = None,
        progress: Progress | None = None,
        vocab_size: int | None = None,
    ):
        self.endpoints = endpoints
        self.concurrency = max(1, int(concurrency))
        self.request_timeout = float(request_timeout)
        # the budget is a time window (a brief outage of every engine is waited out), capped by a count
        self.retry_policy = RetryPolicy(
            max_retries=int(max_retries), window=None if retry_window is None else float(retry_window)
        )
        self.stats = HttpStats()
        self.abort_stats = HttpStats()  # `/abort_request` calls: sent once each, failures counted by reason
        self.progress = progress if progress is not None else Progress()
        self.http = HttpClient()
        self.in_flight = 0
        self._tokenizer_path, self._tokenizer = tokenizer_path, tokenizer
        self._vocab_size = vocab_size
        # asyncio primitives are loop-bound: one bound per event loop
        self._bounds: PerLoop[asyncio.Semaphore] = PerLoop(lambda: asyncio.Semaphore(self.concurrency))
        self._rid_prefix, self._rid = f"slime-{os.getpid()}-", itertools.count()
        self._background: set[asyncio.Task] = set()  # rid aborts in flight (kept referenced until done)
        self.disconnect_aborts = 0  # abandoned rids left to the router's closed connection (`_renew_rid`)
        self.gate = AbortGate()

    @classmethod
    def from_args(cls, args: Any, endpoints: Endpoints, **kw: Any) -> "EngineClient":
        """The client of a parsed (or completed) namespace: its config, `engines` behind the router."""
        return cls.of(RolloutRunConfig.from_args(args), endpoints, engines=rollout_num_engines(args), **kw)

    @classmethod
    def of(cls, config: RolloutRunConfig, endpoints: Endpoints, *, engines: int, **kw: Any) -> "EngineClient":
        rollout = config.rollout
        return cls(
            endpoints,
            concurrency=rollout.sglang_server_concurrency * max(1, engines),  # slime's bound: this many per engine
            request_timeout=rollout.request_timeout,
            max_retries=rollout.request_max_retries,
            retry_window=config.request_retry_window,
            tokenizer_path=config.hf_checkpoint,
            **kw,
        )

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
    def vocab_size(self) -> int | None:
        """Ids an answer may hold: [0, vocab_size), the larger of the tokenizer's length and the model's
        embedding rows; None (no upper bound checked) when the client has neither."""
        if self._vocab_size is None and (self._tokenizer is not None or self._tokenizer_path):
            try:
                tokens = len(self.tokenizer)
            except TypeError:  # a processor without a length: the model's config decides alone
                tokens = None
            self._vocab_size = max((n for n in (tokens, model_vocab_size(self._tokenizer_path)) if n), default=None)
        return self._vocab_size

    def engine_label(self, url: str | None) -> str:
        """Which engine answered, as far as this client can know: sglang-router 0.3.2 names no worker
        in its answers, so behind a router of several engines it is "one of N"."""
        if url:
            return url
        engines = self.endpoints.engine_urls
        if len(engines) == 1:
            return engines[0]
        return f"one of {len(engines)} engines behind the router {self.endpoints.router_url}"

    @property
    def semaphore(self) -> asyncio.Semaphore:
        """The in-flight bound of the running event loop."""
        return self._bounds.get()

    def new_rid(self) -> str:
        return f"{self._rid_prefix}{next(self._rid)}"

    async def post(
        self,
        url: str | Callable[[], str],
        payload: Any,
        *,
        timeout: float | None = None,
        policy: RetryPolicy | None = None,
        headers: dict[str, str] | None = None,
        on_retry: Any = None,
        answer: Any = None,
    ) -> Any:
        """Any JSON POST, with this client's deadline, retry budget and counters; `answer(raw)` checks
        a 2xx body (see `request_json`)."""
        return await request_json(
            "POST",
            url,
            payload,
            session=self.http.pool(),
            timeout=timeout or self.request_timeout,
            policy=policy or self.retry_policy,
            stats=self.stats,
            headers=headers,
            on_retry=on_retry,
            answer=answer,
            classify=router_fault,
            watch=self.endpoints.router_losses.watch,
            outage=self.endpoints.outage,
        )

    def _renew_rid(self, payload: dict[str, Any], failure: Failure, engine: str | None) -> dict[str, Any]:
        """A retried request gets a fresh `rid`; the old one is aborted where it was, if an engine may
        still run it (no answer came back: an answer, even an error, means none does).
        - Sent to a known `engine` (`generate(url=...)`, or a "router" that is one of the fleet's
          engines): our own record says where, and one `/abort_request` goes there.
        - Sent through the router: sglang-router 0.3.2 names no worker, but it closes its connection
          to the engine that had the request when ours closes (our deadline passed, or the link to
          the router broke), and the engine aborts a request whose client went away (SGLang's
          tokenizer manager does; so do `slime.engine.hf_server` and the scripted engine). That
          closed connection is the abort, delivered to that engine only; nothing is sent, and it is
          counted in `disconnect_aborts`."""
        if failure.may_still_run:
            if engine is not None:
                self._in_background(self._abort_on([engine], payloads.abort_request(rid=payload["rid"])))
            else:
                self.disconnect_aborts += 1
        return {**payload, "rid": self.new_rid()}

    async def _abort_abandoned(self, rid: str, engine: str | None) -> None:
        """A cancelled request, aborted where it was before the cancellation completes (as `_renew_rid`
        does for a retried one): one `/abort_request` to a known `engine`; through the router, the
        connection the cancellation closed is the abort (counted in `disconnect_aborts`)."""
        if engine is None:
            self.disconnect_aborts += 1
            return
        await self._abort_on([engine], payloads.abort_request(rid=rid))

    def _in_background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def engine_urls(self) -> list[str]:
        """Where aborts go (the router does not proxy them): the fleet's engines; with no fleet bound
        (a plugin driving rollouts against --sglang-router-ip/--sglang-router-port), the router's
        workers, asked each time (`GET /workers`, as slime does)."""
        if self.endpoints.engine_urls or not self.endpoints.router_url:
            return list(self.endpoints.engine_urls)
        router = self.router_url
        try:  # a bad answer (router_answer) is refused whole and counted in `stats` by its field
            workers = await self.http.get(
                f"{router}/workers",
                timeout=10,
                policy=RetryPolicy(max_retries=0),
                stats=self.stats,
                answer=lambda raw: parse_workers(raw, router),
            )
        except HttpError as e:
            logger.warning("abort: cannot list the router's workers (%s); nothing aborted", e)
            return []
        return [w.url for w in workers]

    async def _abort_on(self, urls: list[str], body: dict[str, Any]) -> None:
        """One `/abort_request` per engine of `urls`, sent once (an abort is only worth its moment); a
        failed one is counted in `abort_stats` by reason, never raised."""
        once = RetryPolicy(max_retries=0)
        await asyncio.gather(
            *(
                request_json(
                    "POST",
                    f"{u}/abort_request",
                    body,
                    session=self.http.pool(),
                    timeout=10,
                    policy=once,
                    stats=self.abort_stats,
                    answer=_no_body,
                )
                for u in urls
            ),
            return_exceptions=True,
        )

    async def generate(
        self,
        input_ids: list[int],
        sampling_params: dict[str, Any],
        *,
        rid: str | None = None,
        url: str | None = None,
        routing_key: str | None = None,
        top_logprobs_num: int = 0,
        image_data: list[str] | None = None,
    ) -> EngineOutput:
        """One `/generate` with log-probs, bounded by the in-flight semaphore and a deadline.
        `routing_key`: sent as `X-SMG-Routing-Key`, so a consistent-hashing router keeps a session on one engine.
        `top_logprobs_num` > 0: the answer must also carry the k most likely tokens per position.
        `image_data`: a vision-language model's images for the image placeholders of `input_ids` (data URIs)."""
        payload = payloads.generate(
            input_ids,
            sampling_params,
            rid=rid or self.new_rid(),
            top_logprobs_num=top_logprobs_num,
            image_data=image_data,
        )
        # the answer's check, as a partial (called from C: one Python frame less per request than a closure)
        answer = functools.partial(
            parse_generate_answer,
            vocab_size=self.vocab_size,
            max_new_tokens=sampling_params.get("max_new_tokens"),
            top_logprobs_num=top_logprobs_num,
        )
        bound = self._bounds.get()  # `async with self.semaphore`, without its two coroutine frames
        await bound.acquire()
        try:
            if self.gate.closed:  # aborted while waiting for a slot: never sent, nothing sampled
                return EngineOutput([], [], "", "abort")
            self.in_flight += 1
            if url:  # a whole /generate URL, as before
                where, engine = url, url.removesuffix("/generate")
            else:  # the router's address is read again for each retry: it may have been restarted elsewhere
                where, base = self._router_generate_url, self.router_url
                engine = base if base in self.endpoints.engine_urls else None

            sent = [payload["rid"]]  # the rid on the wire now (a retry renews it)

            def renew(body: dict[str, Any], failure: Failure) -> dict[str, Any]:
                body = self._renew_rid(body, failure, engine)
                sent[0] = body["rid"]
                return body

            try:
                out = await request_json(  # what `post` sends, one coroutine less per request
                    "POST",
                    where,
                    payload,
                    session=self.http.pool(),
                    timeout=self.request_timeout,
                    policy=self.retry_policy,
                    stats=self.stats,
                    headers={"X-SMG-Routing-Key": routing_key} if routing_key else None,
                    on_retry=renew,
                    answer=answer,
                    classify=router_fault,
                    watch=self.endpoints.router_losses.watch,
                    outage=self.endpoints.outage,
                )
            except HttpError as e:
                raise HttpError(f"{e} (engine: {self.engine_label(url)})", e.status, e.body, e.reason) from e
            except asyncio.CancelledError:  # the caller gave up (an agent turn whose client left)
                await self._abort_abandoned(sent[0], engine)
                raise
            finally:
                self.in_flight -= 1
        finally:
            bound.release()
        self.progress.on_response(len(out.token_ids))
        return out

    def _router_generate_url(self) -> str:
        """The router's /generate, asked before every attempt (a restarted router may serve elsewhere)."""
        router = self.endpoints.router_url
        return f"{router if router else self.router_url}/generate"  # (`router_url` raises: no router)

    async def abort_all(self) -> None:
        """Abort every in-flight request on every engine (the router does not proxy abort)."""
        await self._abort_on(await self.engine_urls(), payloads.abort_request(abort_all=True))

    async def abort_until_settled(
        self, tasks: "set[asyncio.Future] | list[asyncio.Future]", timeout: float | None
    ) -> tuple[set, set]:
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
        """Close this client's HTTP sessions, on every loop it ran on, after its background rid
        aborts on the running loop (at most `CLOSE_TIMEOUT` seconds, then cancelled): one still
        running would open a new session after this one closed, and that one would never be closed."""
        await self._settle_background()
        await self.http.close()

    async def close_loop(self) -> None:
        """Close the running loop's session only: a server sharing this client whose loop ends."""
        await self._settle_background()
        await self.http.close_loop()

    async def _settle_background(self) -> None:
        loop = asyncio.get_running_loop()
        mine = {t for t in self._background if t.get_loop() is loop}
        if mine:
            _, late = await asyncio.wait(mine, timeout=CLOSE_TIMEOUT)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
