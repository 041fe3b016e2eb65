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
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp

from slime.utils.answer_error import AnswerError  # noqa: F401 - its public path stays here too
from slime.utils.encoded_ids import EncodedIds, dumps
from slime.utils.per_loop import PerLoop, close_on_their_loops
from slime.utils.router_loss import RouterLost

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


def _new_session() -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


class HttpClient:
    """Pooled aiohttp sessions, one per event loop (sessions are loop-bound; see `PerLoop`). The
    client owns them: `close()` closes every one, each on its own loop. A loop that has ended
    (`asyncio.run` returned) can run nothing any more, so code that uses a client inside
    `asyncio.run` calls `close_loop()` before it returns."""

    def __init__(self) -> None:
        self._sessions: PerLoop[aiohttp.ClientSession] = PerLoop(_new_session, usable=lambda s: not s.closed)

    def session(self) -> aiohttp.ClientSession:
        return self._sessions.get()

    async def close_loop(self) -> None:
        """Close the running loop's session only (a server whose loop ends; the client's other loops go on)."""
        s = self._sessions.pop()
        if s is not None:
            await s.close()

    async def close(self) -> None:
        """Close every session: the running loop's here, another running loop's on that loop (within
        `CLOSE_TIMEOUT` seconds). A session of a loop that no longer runs cannot be closed: it is
        counted in a log line (its user should have called `close_loop()` before its loop ended)."""
        open_sessions = [(loop, s) for loop, s in self._sessions.drain() if not s.closed]
        ended = await close_on_their_loops(open_sessions, lambda s: s.close(), CLOSE_TIMEOUT)
        if ended:
            logger.info("%d HTTP session(s) of event loops that no longer run could not be closed", ended)

    async def request(self, method: str, url: str, payload: Any = None, **kw: Any) -> Any:
        return await request_json(method, url, payload, session=self.session(), **kw)

    async def post(self, url: str, payload: Any, **kw: Any) -> Any:
        return await request_json("POST", url, payload, session=self.session(), **kw)

    async def get(self, url: str, **kw: Any) -> Any:
        return await request_json("GET", url, None, session=self.session(), **kw)


@functools.lru_cache(maxsize=64)
def _attempt_timeout(seconds: float) -> aiohttp.ClientTimeout:
    """Cache keyed by the deadline in seconds: ClientTimeout is immutable, and building one per
    request costs more than the rest of the retry wrapper's fast path."""
    return aiohttp.ClientTimeout(total=seconds)


def _retry_after(headers: Any) -> float | None:
    try:
        return float(headers.get("Retry-After")) if headers.get("Retry-After") else None
    except (TypeError, ValueError):
        return None


def _body(payload: Any, headers: dict[str, str] | None) -> dict[str, Any]:
    """aiohttp's `json=`, except a body whose `input_ids` carry their JSON text is written from it."""
    if isinstance(payload, dict) and isinstance(payload.get("input_ids"), EncodedIds):
        return {"data": dumps(payload).encode(), "headers": {"Content-Type": "application/json", **(headers or {})}}
    return {"json": payload, "headers": headers}


async def request_json(
    method: str,
    url: str | Callable[[], str],
    payload: Any = None,
    *,
    timeout: float,
    policy: RetryPolicy | None = None,
    stats: HttpStats | None = None,
    session: aiohttp.ClientSession | None = None,
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
    `http_<status>` (e.g. a proxy's code for an upstream answer cut mid-way). Without a `session`
    a one-off session is opened and closed around the call. `on_retry(payload, failure)` gives the
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
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as own:
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
                # awaited, not `async with`: what its exit does (release, then wait for the body's writer) is
                # the `finally` below, without the four coroutines of aiohttp's two context managers
                resp = await session.request(method, url, **_body(payload, headers), timeout=_attempt_timeout(timeout))
                try:
                    status = resp.status
                    if status < 400:
                        if answer is not None:
                            return answer(await resp.read())
                        if resp.content_type == "application/json":
                            return await resp.json()
                        return await resp.text()
                    last = (await resp.text(errors="replace"))[:2000]
                    if status != 429 and status < 500:
                        stats.failed(f"http_{status}")
                        raise HttpError(f"{method} {url} -> HTTP {status}: {last}", status, last)
                    reason = (classify(status, last) if classify else None) or f"http_{status}"
                    failure, retry_after = Failure(reason, last, False), _retry_after(resp.headers)
                finally:
                    resp.release()
                    await resp.wait_for_close()
        except RouterLost as e:  # no answer will come: the request may still run on an engine
            failure = Failure("router_lost", str(e), True)
        except AnswerError as e:
            failure = Failure(e.reason, str(e), False)
        except aiohttp.ClientPayloadError as e:  # the answer began and was cut: the server is done with it
            failure = Failure("answer_cut", f"{type(e).__name__}: {e}", False)
        except aiohttp.ClientConnectorError as e:  # never connected: nothing was sent
            failure = Failure("connection", f"{type(e).__name__}: {e}", False)
        except (aiohttp.ClientConnectionError, ConnectionError) as e:
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
