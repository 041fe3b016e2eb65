"""`exit_now`: a command that has stopped everything it started ends at once, without the interpreter's teardown.

Why: by the time `run_cli` returns, the manager, Ray and the engine fork server are stopped and every
descendant is reaped; what `sys.exit` still does is tear down the interpreter (every module of Ray,
its gRPC core worker, the tokenizer's libraries), which took seconds on a loaded 2-core box after the
last line was printed (bench/bench_cold_start.py: `atexit` handlers done 4.3 s before the process
was gone, at load 20). The exit handlers still run (logging flushes its files, Ray its own), then
stdout and stderr are flushed and the process ends with `os._exit`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn

from slime.utils.startup_trace import mark


def exit_now(code: int) -> NoReturn:
    try:
        atexit._run_exitfuncs()  # what the interpreter runs first at exit (threads are ours to have stopped)
    finally:
        mark("exit: exit handlers done")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
