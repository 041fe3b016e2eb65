"""Async HTTP with a deadline on every request and classified, budgeted retries.

Why not blind retries: a 4xx is the caller's bug and retrying it only hides the bug; a
connection error or 5xx is usually a dying or restarting server (engine crash, router restart)
and is worth retrying with back-off. The budget is a time window with a count cap, not a bare
count: a router that marks a frozen engine unhealthy answers 503 at once, and a count alone is
spent in seconds on those instant refusals although the engine comes back moments later. Every
retry is counted in `HttpStats` with its reason so faults show up in metrics instead of
disappearing. A 2xx answer the caller cannot use (`answer=` raises `AnswerError`) is a fault of
the server like a 5xx, retried and counted under the reason the check gives. When the budget is
spent, the error's reason is the first fault (the cause), not the last refusal it led to.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from slime.utils.answer_error import AnswerError  # noqa: F401 - its public path stays here too
from slime.utils.encoded_ids import body_pieces
from slime.utils.http1_pool import Answer, AnswerCut, ConnectionDropped, Http1Pool, NotConnected
from slime.utils.per_loop import PerLoop, close_on_their_loops
from slime.utils.router_loss import RouterLost

if TYPE_CHECKING:  # aiohttp is imported where a session is made: JSON requests go through `Http1Pool`
    import aiohttp

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Failure:
    """One failed attempt: `reason` (short, counted), `detail` (for the message), and whether the
    request may still be running on a server (no answer came back: an attempt timeout, or the
    connection dropped before any answer), which is when the caller may want to abort it."""

    reason: str
    detail: str
    may_still_run: bool


class HttpError(RuntimeError):
    """A request that failed for good: non-retryable status, or the retry budget is spent."""

    def __init__(self, message: str, status: int | None = None, body: str = "", reason: str | None = None):
        super().__init__(message)
        self.status = status
        self.body = body
        # short and stable, for counting failures by kind: "timeout", "connection", "http_503", "http_400"
        self.reason = reason or (f"http_{status}" if status is not None else "error")


@dataclass
class HttpStats:
    """Counters for metrics: requests, retries by reason, failures."""

    requests: int = 0
    retries: Counter = field(default_factory=Counter)
    failures: int = 0
    failure_reasons: Counter = field(default_factory=Counter)  # requests that failed for good, by reason

    @property
    def total_retries(self) -> int:
        return sum(self.retries.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "retries": self.total_retries,
            "failures": self.failures,
            **{f"retries_{k}": v for k, v in self.retries.items()},
            **{f"failures_{k}": v for k, v in self.failure_reasons.items()},
        }

    def failed(self, reason: str) -> None:
        self.failures += 1
        self.failure_reasons[reason] += 1


@dataclass
class RetryPolicy:
    """Retry while `window` seconds (from the first attempt, or from the pool's last outage or return:
    `request_json(outage=)`) have not passed, at most `max_retries` times; `window=None` is a pure
    count. The next attempt must start inside the window."""

    max_retries: int = 8
    window: float | None = None
    base_delay: float = 0.1
    max_delay: float = 2.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Exponential back-off with full jitter; a server's Retry-After wins when larger."""
        d = random.uniform(0, min(self.max_delay, self.base_delay * (2**attempt)))
        return max(d, retry_after or 0.0)

    def gives_up(self, attempt: int, elapsed: float, delay: float) -> bool:
        """True when retry number `attempt + 1` (after sleeping `delay`) is outside the budget."""
        if attempt >= self.max_retries:
            return True
        return self.window is not None and elapsed + delay > self.window


CLOSE_TIMEOUT = 10.0  # seconds `HttpClient.close` waits for a session on another loop to close


def _new_session() -> "aiohttp.ClientSession":
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


class HttpClient:
    """Pooled connections, one set per event loop (they are loop-bound; see `PerLoop`): an `Http1Pool`
    for `request`/`post`/`get` (the JSON requests of `request_json`), and an aiohttp session for callers
    that need aiohttp's own API (`session()`: streamed bodies, multipart). The client owns both:
    `close()` closes every one, each on its own loop. A loop that has ended (`asyncio.run` returned)
    can run nothing any more, so code that uses a client inside `asyncio.run` calls `close_loop()`
    before it returns."""

    def __init__(self) -> None:
        self._sessions: PerLoop["aiohttp.ClientSession"] = PerLoop(_new_session, usable=lambda s: not s.closed)
        self._pools: PerLoop[Http1Pool] = PerLoop(Http1Pool, usable=lambda p: not p.closed)

    def session(self) -> "aiohttp.ClientSession":
        return self._sessions.get()

    def pool(self) -> Http1Pool:
        return self._pools.get()

    async def close_loop(self) -> None:
        """Close the running loop's connections only (a server whose loop ends; the client's other loops go on)."""
        for owned in (self._sessions.pop(), self._pools.pop()):
            if owned is not None:
                await owned.close()

    async def close(self) -> None:
        """Close every session and pool: the running loop's here, another running loop's on that loop
        (within `CLOSE_TIMEOUT` seconds). One of a loop that no longer runs cannot be closed: it is
        counted in a log line (its user should have called `close_loop()` before its loop ended)."""
        owned = [(loop, s) for loop, s in self._sessions.drain() + self._pools.drain() if not s.closed]
        ended = await close_on_their_loops(owned, lambda s: s.close(), CLOSE_TIMEOUT)
        if ended:
            logger.info("%d HTTP session(s) of event loops that no longer run could not be closed", ended)

    async def request(self, method: str, url: str, payload: Any = None, **kw: Any) -> Any:
        return await request_json(method, url, payload, session=self.pool(), **kw)

    async def post(self, url: str, payload: Any, **kw: Any) -> Any:
        return await request_json("POST", url, payload, session=self.pool(), **kw)

    async def get(self, url: str, **kw: Any) -> Any:
        return await request_json("GET", url, None, session=self.pool(), **kw)


@functools.lru_cache(maxsize=64)
def _attempt_timeout(seconds: float) -> "aiohttp.ClientTimeout":
    """Cache keyed by the deadline in seconds: ClientTimeout is immutable, and building one per
    request costs more than the rest of the retry wrapper's fast path."""
    import aiohttp

    return aiohttp.ClientTimeout(total=seconds)


def _retry_after(headers: dict[str, str]) -> float | None:
    try:
        return float(headers.get("retry-after")) if headers.get("retry-after") else None
    except (TypeError, ValueError):
        return None


def _encode(payload: Any) -> list[bytes] | None:
    """The JSON body in pieces (`body_pieces`: a body whose `input_ids` carry their JSON text is written from it)."""
    return None if payload is None else body_pieces(payload)


async def _exchange(
    session: "Http1Pool | aiohttp.ClientSession",
    method: str,
    url: str,
    payload: Any,
    headers: dict[str, str] | None,
    timeout: float,
) -> Answer:
    """One attempt's whole answer, through the pool (or aiohttp: a session given, or a URL that is not
    `http://`), its failures as the pool's (`NotConnected`, `ConnectionDropped`, `AnswerCut`)."""
    if not isinstance(session, Http1Pool):
        return await _aiohttp_exchange(session, method, url, payload, headers, timeout)
    target = session.target(url)
    if target is not None:
        return await session.request(method, target, _encode(payload), timeout=timeout, headers=headers)
    async with _new_session() as own:  # a URL the pool cannot send (not `http://`)
        return await _aiohttp_exchange(own, method, url, payload, headers, timeout)


async def _aiohttp_exchange(
    session: "aiohttp.ClientSession",
    method: str,
    url: str,
    payload: Any,
    headers: dict[str, str] | None,
    timeout: float,
) -> Answer:
    import aiohttp

    pieces = _encode(payload)
    body = None if pieces is None else b"".join(pieces)
    if body is not None:
        headers = {"Content-Type": "application/json", **(headers or {})}
    try:
        # awaited, not `async with`: what its exit does (release, then wait for the body's writer) is the
        # `finally` below
        resp = await session.request(method, url, data=body, headers=headers, timeout=_attempt_timeout(timeout))
        try:
            return Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()}, await resp.read())
        finally:
            resp.release()
            await resp.wait_for_close()
    except aiohttp.ClientPayloadError as e:
        raise AnswerCut(f"{type(e).__name__}: {e}") from e
    except aiohttp.ClientConnectorError as e:
        raise NotConnected(f"{type(e).__name__}: {e}") from e
    except aiohttp.ClientConnectionError as e:
        raise ConnectionDropped(f"{type(e).__name__}: {e}") from e


async def request_json(
    method: str,
    url: str | Callable[[], str],
    payload: Any = None,
    *,
    timeout: float,
    policy: RetryPolicy | None = None,
    stats: HttpStats | None = None,
    session: "Http1Pool | aiohttp.ClientSession | None" = None,
    headers: dict[str, str] | None = None,
    on_retry: Callable[[Any, Failure], Any] | None = None,
    answer: Callable[[bytes], Any] | None = None,
    classify: Callable[[int, str], str | None] | None = None,
    watch: Callable[[str], Any] | None = None,
    outage: Any = None,
) -> Any:
    """Send one JSON request; return the decoded body (or text when it is not JSON), or what
    `answer(body_bytes)` makes of a 2xx body (it raises `AnswerError` for an unusable one).

    `timeout` is the deadline of each attempt. Retried: connection errors, attempt timeouts,
    429, 5xx and `AnswerError`s. Not retried: other 4xx (raised at once as HttpError with the
    body). `classify(status, body)` may name the reason of an error status more exactly than
    `http_<status>` (e.g. a proxy's code for an upstream answer cut mid-way). `session`: an
    `Http1Pool` (`HttpClient.pool()`) or an aiohttp session; without one a one-off pool is opened and
    closed around the call. `on_retry(payload, failure)` gives the
    payload of the next attempt (e.g. a fresh request id: the server may still be working on the
    abandoned one, which `failure.may_still_run` says). `url` may be a function, asked again before
    every attempt (a router restarted elsewhere is at a new address). `watch(url)`: a context (`with`, on the
    attempt's task) around each attempt that raises RouterLost when that address is known gone
    (slime.utils.router_loss): the attempt fails at once (`router_lost`) instead of at its deadline, and is retried. `outage`
    (slime.utils.endpoints.EngineOutage: `since`, `empty`): the retry window counts from the later of the
    first attempt and the moment the pool of engines last emptied or came back, and a failure while it is
    empty does not count against `policy.max_retries`.
    """
    if session is None:
        own = Http1Pool()
        try:
            return await request_json(
                method,
                url,
                payload,
                timeout=timeout,
                policy=policy,
                stats=stats,
                session=own,
                headers=headers,
                on_retry=on_retry,
                answer=answer,
                classify=classify,
                watch=watch,
                outage=outage,
            )
        finally:
            await own.close()
    policy = policy or RetryPolicy()
    stats = stats if stats is not None else HttpStats()
    where = url if callable(url) else None  # a fixed URL is not asked for (one call less per attempt)
    attempt = counted = 0  # attempts made; those that count against max_retries (not while no engine exists)
    started = time.monotonic()
    first: Failure | None = None
    while True:
        stats.requests += 1
        retry_after, status = None, None
        if where is not None:
            url = where()
        try:
            with watch(url) if watch is not None else contextlib.nullcontext():
                got = await _exchange(session, method, url, payload, headers, timeout)
            status = got.status
            if status < 400:
                if answer is not None:
                    return answer(got.body)
                if got.content_type == "application/json":
                    return json.loads(got.body)
                return got.body.decode("utf-8", "replace")
            last = got.body.decode("utf-8", "replace")[:2000]
            if status != 429 and status < 500:
                stats.failed(f"http_{status}")
                raise HttpError(f"{method} {url} -> HTTP {status}: {last}", status, last)
            reason = (classify(status, last) if classify else None) or f"http_{status}"
            failure, retry_after = Failure(reason, last, False), _retry_after(got.headers)
        except RouterLost as e:  # no answer will come: the request may still run on an engine
            failure = Failure("router_lost", str(e), True)
        except AnswerError as e:
            failure = Failure(e.reason, str(e), False)
        except AnswerCut as e:  # the answer began and was cut: the server is done with it
            failure = Failure("answer_cut", f"{type(e).__name__}: {e}", False)
        except NotConnected as e:  # never connected: nothing was sent
            failure = Failure("connection", f"{type(e).__name__}: {e}", False)
        except ConnectionError as e:
            failure = Failure("connection", f"{type(e).__name__}: {e}", True)
        except asyncio.TimeoutError:
            failure = Failure("timeout", f"no answer within {timeout:.1f}s", True)
        first = first or failure
        delay = policy.delay(attempt, retry_after)
        now = time.monotonic()
        window_from = started if outage is None or outage.since is None else max(started, outage.since)
        if policy.gives_up(counted, now - window_from, delay):
            raise _spent(
                method, url, attempt, now - started, first, failure, status if (status or 0) >= 400 else None, stats
            )
        stats.retries[failure.reason] += 1
        await asyncio.sleep(delay)
        attempt += 1
        if outage is None or not outage.empty:
            counted += 1
        if on_retry is not None:
            payload = on_retry(payload, failure)


def _spent(
    method: str,
    url: str,
    attempt: int,
    elapsed: float,
    first: Failure,
    last: Failure,
    status: int | None,
    stats: HttpStats,
) -> HttpError:
    """The budget is spent: the error's reason is the first fault, which caused the rest (an engine
    that cut its answer and died is then refused by the router as `no_available_workers`)."""
    stats.failed(first.reason)
    then = "" if (last.reason, last.detail) == (first.reason, first.detail) else f"; last: {last.reason}: {last.detail}"
    return HttpError(
        f"{method} {url} failed after {attempt + 1} attempt(s) in {elapsed:.1f}s, "
        f"cause: {first.reason}: {first.detail}{then}",
        status,
        last.detail if status else "",
        reason=first.reason,
    )


async def post(url: str, payload: Any, **kw: Any) -> Any:
    return await request_json("POST", url, payload, **kw)


async def get(url: str, **kw: Any) -> Any:
    return await request_json("GET", url, None, **kw)
