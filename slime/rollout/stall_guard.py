"""`StallGuard`: a rollout function that cannot make progress fails with its error, it does not hang.

A plugin may swallow its own errors and retry forever: slime's fully-async worker catches every
exception of its loop, logs it and tries again a second later, while the rollout function waits
for groups that never come. The guard watches two things while the controller runs a rollout
function: the error records logged in this process (any logger, any thread: records with an
exception attached, or at ERROR and above) and the rollout's progress (samples, engine responses,
tokens). When the same error (type and message) has been logged `repeats` times over at least
`min_seconds` with no progress at all since its first occurrence, the guard trips: the rollout
function's `async_utils.run` returns at once and raises `RolloutStalledError`, whose message
names the error and where it was raised and whose `__cause__` is the original exception (with
its traceback, so the plugin's own file and line are printed). Progress of any kind starts the
count again, so a rollout that keeps going despite occasional errors is never stopped.

Usage (the controller, around the rollout function call):

    with StallGuard(runtime.progress).installed():
        out = rollout_function(args, rollout_id, data_source)
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
import traceback
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from slime.utils.async_utils import watched

DEFAULT_REPEATS = 5
DEFAULT_MIN_SECONDS = 10.0


class RolloutStalledError(RuntimeError):
    """The rollout made no progress while the same error kept being logged."""


def _progress_snapshot(progress: Any) -> tuple:
    return (getattr(progress, "samples_done", 0), getattr(progress, "responses", 0), getattr(progress, "tokens", 0))


def _where(exc: BaseException | None, record: logging.LogRecord) -> str:
    """The innermost frame of the exception (the line that raised), else the logging call site."""
    if exc is not None and exc.__traceback__ is not None:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return f"{record.pathname}:{record.lineno}"


class StallGuard(logging.Handler):
    def __init__(
        self,
        progress: Any,
        *,
        repeats: int = DEFAULT_REPEATS,
        min_seconds: float = DEFAULT_MIN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__(level=logging.WARNING)
        self.progress, self.repeats, self.min_seconds, self.clock = progress, int(repeats), float(min_seconds), clock
        self.tripped: concurrent.futures.Future = concurrent.futures.Future()
        self._key: tuple[str, str] | None = None
        self._count = 0
        self._first_at = 0.0
        self._progress_at_first: tuple = ()

    def emit(self, record: logging.LogRecord) -> None:  # called under the handler's lock, from any thread
        exc = record.exc_info[1] if record.exc_info and record.exc_info[1] is not None else None
        if exc is None and record.levelno < logging.ERROR:
            return
        if self.tripped.done():
            return
        key = (type(exc).__name__, str(exc)) if exc is not None else ("log", record.getMessage())
        now, snapshot = self.clock(), _progress_snapshot(self.progress)
        if key != self._key or snapshot != self._progress_at_first:
            self._key, self._count, self._first_at, self._progress_at_first = key, 0, now, snapshot
        self._count += 1
        if self._count >= self.repeats and now - self._first_at >= self.min_seconds:
            what = f"{key[0]}: {key[1]}" if exc is not None else key[1]
            error = RolloutStalledError(
                f"the rollout made no progress while the same error was logged {self._count} times in "
                f"{now - self._first_at:.1f}s (logger {record.name!r}, raised at {_where(exc, record)}): {what}"
            )
            error.__cause__ = exc
            self.tripped.set_exception(error)

    @contextmanager
    def installed(self, logger: logging.Logger | None = None) -> Iterator["StallGuard"]:
        """Listen on `logger` (the root logger: every logger propagates there) and watch `run`."""
        target = logger or logging.getLogger()
        target.addHandler(self)
        try:
            with watched(self):
                yield self
        finally:
            target.removeHandler(self)
