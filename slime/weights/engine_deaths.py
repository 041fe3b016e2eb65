"""How a weight push tells a dead engine from a refusing one, and the errors a push raises.

An engine may carry an exit notice (`exited`: a future completed when its process is gone;
`slime.fleet.engine_actor.RemoteEngine` gets it from the fleet's supervised actor). A call that
failed without an answer makes the engine a suspect; its exit notice, not the failure, says it died.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Iterable, Sequence
from typing import Any

import requests

# a request that failed without an answer: time for the engine's exit notice to arrive (spent only when
# no notice comes; a loaded host may take seconds to reap a killed engine)
DEATH_GRACE_S = 30.0


class WeightSyncError(RuntimeError):
    """A push or group operation failed; the message names the engine and what it said."""


class EngineAnswered(WeightSyncError):
    """The engine answered with an error status: it is alive (a refusal, not a death)."""


class EnginesDied(WeightSyncError):
    """Engines whose process exited during a group operation (`dead`); the group was dropped. `calls`:
    (engine, future) of each engine's call in the operation the deaths cut short (how the survivors' ended
    is part of the loss's record)."""

    def __init__(self, message: str, dead: list[Any], calls: Iterable[tuple[Any, cf.Future]] = ()):
        super().__init__(message)
        self.dead = dead
        self.calls = list(calls)


def exit_notice(engine: Any) -> cf.Future | None:
    """The engine's exit notice (a future done once its process is gone), or None when it has none."""
    notice = getattr(engine, "exited", None)
    return notice if isinstance(notice, cf.Future) else None


def _one_line(exc: BaseException) -> str:
    """The error in one line; a remote call's error (Ray's RayTaskError: its `cause`) as the callee raised it,
    without the remote traceback."""
    cause = getattr(exc, "cause", None)
    exc = cause if isinstance(cause, BaseException) else exc
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:1000]


def exit_reason(engine: Any) -> str | None:
    """How the engine's exit notice says it ended (for a Ray actor lost with its node, the error names
    the node), or None when it has no notice."""
    notice = exit_notice(engine)
    if notice is None:
        return None
    if not notice.done():
        return "no exit notice yet"
    exc = notice.exception()
    return _one_line(exc) if exc is not None else f"exited with code {notice.result()}"


def call_outcome(f: cf.Future) -> str:
    """How one engine call ended: "answered", its failure in one line, or "no answer yet"."""
    if not f.done():
        return "no answer yet"
    exc = failure(f)
    return "answered" if exc is None else _one_line(exc)


def answered(exc: BaseException | None) -> bool:
    """Whether a failed call got the engine's own answer (an HTTP status): the engine is alive."""
    return isinstance(exc, (EngineAnswered, requests.HTTPError)) and not isinstance(exc, requests.ConnectionError)


def failure(f: cf.Future) -> BaseException | None:
    return f.exception() if f.done() and not f.cancelled() else None


def suspects(engines: Sequence[Any], futures: Sequence[cf.Future]) -> list[Any]:
    """The engines whose call failed without their own answer: each may have died (its exit notice says)."""
    return [e for e, f in zip(engines, futures) if failure(f) and not answered(failure(f))]


def dead_engines(engines: Sequence[Any], suspects: Sequence[Any] = (), grace: float = DEATH_GRACE_S) -> list[Any]:
    """The engines whose process is gone: those whose exit notice arrived, waiting up to `grace` for
    the first notice of `suspects` (engines whose call failed without an answer, or that a failed
    collective may have lost: a reset connection arrives a moment before the exit is reported)."""
    notices = [n for n in (exit_notice(e) for e in suspects) if n is not None]
    if notices:
        cf.wait(notices, timeout=grace, return_when=cf.FIRST_COMPLETED)
    return [e for e in engines if (n := exit_notice(e)) is not None and n.done()]
