"""Calling every engine of a push at once: one daemon thread per call, every wait bounded, and an
engine's death (its exit notice) ending the wait at once instead of at the deadline."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from slime.weights.engine_deaths import EnginesDied, WeightSyncError, dead_engines, exit_notice, failure, suspects

logger = logging.getLogger(__name__)


def in_thread(fn, *args, **kwargs) -> cf.Future:
    """Run fn in a daemon thread (a stuck call never blocks interpreter exit; every call has its own deadline)."""
    fut: cf.Future = cf.Future()

    def run():
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter
            fut.set_exception(exc)

    threading.Thread(target=run, daemon=True, name=f"weight-sync-{getattr(fn, '__name__', 'call')}").start()
    return fut


def settled(engines: Sequence[Any], futures: list[cf.Future], timeout: float, *, until_failure: bool) -> None:
    """Wait until every call is answered (or, `until_failure`, one fails), an engine's exit notice
    arrives, or `timeout` passes."""
    notices = [n for n in map(exit_notice, engines) if n is not None]
    deadline = time.monotonic() + timeout
    while True:
        pending = [f for f in futures if not f.done()]
        if not pending or (until_failure and any(map(failure, futures))) or any(n.done() for n in notices):
            return
        left = deadline - time.monotonic()
        if left <= 0:
            return
        cf.wait(pending + notices, timeout=left, return_when=cf.FIRST_COMPLETED)


def call_errors(engines: Sequence[Any], futures: list[cf.Future], timeout: float) -> list[str]:
    out = [f"{e!r}: {failure(f)}" for e, f in zip(engines, futures) if failure(f)]
    return out + [f"{e!r}: no answer within {timeout:g} s" for e, f in zip(engines, futures) if not f.done()]


def gather(engines: Sequence[Any], futures: list[cf.Future], what: str, timeout: float) -> list[Any]:
    """Every engine's answer, or WeightSyncError listing every engine that failed (EnginesDied, with
    the dead engines, when one died: a death ends the wait at once)."""
    t0 = time.monotonic()
    settled(engines, futures, timeout, until_failure=True)
    if all(f.done() and not failure(f) for f in futures):
        return [f.result() for f in futures]
    dead = dead_engines(engines, suspects(engines, futures))
    if not dead:  # a refusal: the other engines' answers too (a death meanwhile still ends the wait)
        settled(engines, futures, max(0.0, timeout - (time.monotonic() - t0)), until_failure=False)
        # an engine lost since (its call failed without an answer) is a suspect too: a survivor's refusal
        # may be the first news of a peer's death (a reset collective), its exit notice the last
        dead = dead_engines(engines, suspects(engines, futures))
    if dead:
        raise EnginesDied(f"{what}: {', '.join(map(repr, dead))} died", dead, zip(engines, futures))
    errors = call_errors(engines, futures, timeout)
    raise WeightSyncError(f"{what} failed on {len(errors)} of {len(engines)} engines: " + "; ".join(errors))


def on_all_engines(engines: Sequence[Any], method: str, timeout: float = 600.0, **kwargs) -> list[Any]:
    """Call `method(**kwargs)` on every engine concurrently; every answer, or one error naming each failure."""
    return gather(engines, [in_thread(getattr(e, method), **kwargs) for e in engines], method, timeout)


def on_live_engines(engines: Sequence[Any], method: str, timeout: float = 600.0, **kwargs) -> list[Any]:
    """`on_all_engines`, where an engine that died meanwhile is no error: the live engines' answers
    (a dead engine's slot holds None); a live engine's failure still raises."""
    futures = [in_thread(getattr(e, method), **kwargs) for e in engines]
    cf.wait(futures, timeout=timeout)
    dead = {id(e) for e in dead_engines(engines, suspects(engines, futures))}
    live = [(e, f) for e, f in zip(engines, futures) if id(e) not in dead]
    if dead:
        logger.warning(
            "%s: skipped %d dead engine(s): %s", method, len(dead), ", ".join(repr(e) for e in engines if id(e) in dead)
        )
    gather([e for e, _ in live], [f for _, f in live], method, timeout)
    return [None if id(e) in dead else f.result() for e, f in zip(engines, futures)]


@contextlib.contextmanager
def paused(engines: Sequence[Any], timeout: float = 600.0) -> Iterator[None]:
    """pause_generation on every engine, then continue_generation on every engine whatever happens
    (an engine that died meanwhile is skipped: its replacement starts unpaused)."""
    on_live_engines(engines, "pause_generation", timeout)
    try:
        yield
    finally:
        on_live_engines(engines, "continue_generation", timeout)


def on_all_engines_quietly(engines: Sequence[Any], method: str, timeout: float = 30.0, **kwargs) -> None:
    """Best-effort cleanup call (an engine that is gone or never had the group is not an error here)."""
    with contextlib.suppress(WeightSyncError):
        on_all_engines(engines, method, timeout, **kwargs)
