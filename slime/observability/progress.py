"""Progress of one rollout: a rich bar on a terminal, throttled plain log lines elsewhere.

Ray actors and CI logs are not terminals; there a redrawing bar would print garbage, so we
fall back to one `logging` line every `log_interval` seconds (and one at the end).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

logger = logging.getLogger("slime.rollout.progress")


class RolloutProgress:
    """`with RolloutProgress(total, "rollout 3") as p: p.update(done=, in_flight=, tokens=, retries=)`.

    Values are running totals (not increments); any left out keep their last value.
    """

    def __init__(
        self,
        total: int,
        description: str = "rollout",
        *,
        log_interval: float = 10.0,
        force_terminal: bool | None = None,
        file: Any = None,
    ):
        self.total = int(total)
        self.description = description
        self.log_interval = log_interval
        self.done = self.in_flight = self.tokens = self.retries = 0
        self._file = file
        self._tty = (
            force_terminal
            if force_terminal is not None
            else bool(getattr(file or sys.stderr, "isatty", lambda: False)())
        )
        self._progress = None
        self._task = None
        self._start = time.monotonic()
        self._last_log = 0.0

    # ---------------------------------------------------------------- context manager
    def __enter__(self) -> "RolloutProgress":
        self._start = time.monotonic()
        if self._tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            console = Console(file=self._file or sys.stderr, force_terminal=True)
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("in flight {task.fields[in_flight]}"),
                TextColumn("{task.fields[tps]:.0f} tok/s"),
                TextColumn("retries {task.fields[retries]}"),
                TimeElapsedColumn(),
                console=console,
                transient=False,
                refresh_per_second=4,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=self.total, in_flight=0, tps=0.0, retries=0)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._refresh()
            self._progress.stop()
        else:
            self._log(final=True)

    # ---------------------------------------------------------------- updates
    @property
    def tokens_per_s(self) -> float:
        elapsed = time.monotonic() - self._start
        return self.tokens / elapsed if elapsed > 0 else 0.0

    def update(
        self,
        done: int | None = None,
        in_flight: int | None = None,
        tokens: int | None = None,
        retries: int | None = None,
        total: int | None = None,
    ) -> None:
        if total is not None:
            self.total = int(total)
        if done is not None:
            self.done = int(done)
        if in_flight is not None:
            self.in_flight = int(in_flight)
        if tokens is not None:
            self.tokens = int(tokens)
        if retries is not None:
            self.retries = int(retries)
        if self._progress is not None:
            self._refresh()
        elif time.monotonic() - self._last_log >= self.log_interval:
            self._log()

    def line(self) -> str:
        return (
            f"{self.description}: {self.done}/{self.total} samples, {self.in_flight} in flight, "
            f"{self.tokens_per_s:.0f} tok/s, {self.retries} retries, {time.monotonic() - self._start:.1f}s"
        )

    def _refresh(self) -> None:
        self._progress.update(
            self._task,
            total=self.total,
            completed=self.done,
            in_flight=self.in_flight,
            tps=self.tokens_per_s,
            retries=self.retries,
        )

    def _log(self, final: bool = False) -> None:
        self._last_log = time.monotonic()
        logger.info("%s%s", self.line(), " (done)" if final else "")
