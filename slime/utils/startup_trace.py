"""Opt-in start-up timeline: with SLIME_STARTUP_TRACE=FILE set, each process of a run appends
`{"t": unix time, "pid", "event"}` lines to FILE as it passes a start-up milestone (Ray up, fork
server preloaded, engine model loaded, ...). bench/bench_cold_start.py reads it to say where the
seconds of a cold start go. Unset (the default), `mark` does nothing."""

from __future__ import annotations

import json
import os
import time

TRACE_ENV = "SLIME_STARTUP_TRACE"


def mark(event: str) -> None:
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    line = json.dumps({"t": time.time(), "pid": os.getpid(), "event": event}) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode())  # one small O_APPEND write: lines of concurrent writers never interleave
        finally:
            os.close(fd)
    except OSError:
        pass


def read(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError:
        return []
