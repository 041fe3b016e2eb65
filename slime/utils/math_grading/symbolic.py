"""Symbolic equivalence of two math answers with math-verify, bounded by a deadline.

math-verify (sympy + a LaTeX grammar) can take seconds, or never return, on adversarial answers,
and its own timeout uses `signal.alarm`, which only works in a process's main thread, while
rewards are computed from asyncio tasks and worker threads. So comparisons run in small worker
processes (`_symbolic_worker.py`, started by file path): the caller waits on the worker's pipe
with a deadline, from any thread, and a worker that misses it is killed and replaced; the answer
then counts as not equivalent. Workers are started on first use and end with their parent
(their stdin closes).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

logger = logging.getLogger(__name__)

_WORKER = Path(__file__).with_name("_symbolic_worker.py")


class _Worker:
    """One worker process and its line-oriented pipe."""

    def __init__(self, command: list[str]) -> None:
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True
        )
        self.fresh = True  # its first answer also waits for math-verify to import
        self._buf = b""

    def ask(self, request: dict, deadline: float) -> dict | None:
        """Send one request; its reply, or None if the deadline passed or the worker died."""
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the worker died
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        self.fresh = False
        try:
            return json.loads(line)
        except ValueError:
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class SymbolicChecker:
    """`equivalent(gold, answer)`: math-verify's verdict within `timeout` seconds, else False.

    Thread-safe; at most `workers` comparisons run at once (callers beyond that wait for a free
    worker, within the same deadline plus `start_timeout` for a worker that is starting).
    """

    def __init__(
        self,
        timeout: float = 5.0,
        workers: int | None = None,
        start_timeout: float = 60.0,
        command: list[str] | None = None,
    ):
        if timeout <= 0:
            raise ValueError(f"SymbolicChecker timeout must be > 0, got {timeout}")
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.max_workers = workers or max(1, min(4, os.cpu_count() or 1))
        # the worker's command line; tests substitute a double that never answers
        self.command = command or [sys.executable, "-u", str(_WORKER)]
        self._idle: list[_Worker] = []
        self._cond = threading.Condition()
        self._started = 0
        self._all: set[_Worker] = set()
        self.timeouts = 0  # comparisons that missed the deadline (their worker was replaced)
        self._finalizer = weakref.finalize(self, SymbolicChecker._kill_all, self._all)

    def equivalent(self, gold: str, answer: str) -> bool:
        worker = self._acquire()
        limit = self.timeout + (self.start_timeout if worker.fresh else 0.0)
        try:
            reply = worker.ask({"gold": gold, "answer": answer, "timeout": self.timeout}, time.monotonic() + limit)
        except BaseException:
            self._discard(worker)
            raise
        if reply is not None and "fatal" in reply:
            self._discard(worker)
            raise RuntimeError(f"math answer grading cannot run: {reply['fatal']}")
        if reply is None:
            logger.warning(
                "math-verify gave no verdict within %.1fs for gold=%.80r answer=%.80r: scored as not equivalent",
                limit,
                gold,
                answer,
            )
            self._discard(worker, timed_out=True)
            return False
        with self._cond:
            self._idle.append(worker)
            self._cond.notify()
        return bool(reply.get("eq"))

    def close(self) -> None:
        """Stop every worker (they also stop by themselves when this process exits)."""
        self._finalizer()

    def _acquire(self) -> _Worker:
        wait = self.timeout + self.start_timeout
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                if self._idle:
                    return self._idle.pop()
                if self._started < self.max_workers:
                    self._started += 1
                    worker = _Worker(self.command)
                    self._all.add(worker)
                    return worker
                left = deadline - time.monotonic()
                if left <= 0 or not self._cond.wait(left):
                    raise TimeoutError(f"no math-verify worker free within {wait:.0f}s")

    def _discard(self, worker: _Worker, timed_out: bool = False) -> None:
        worker.kill()
        with self._cond:
            self._all.discard(worker)
            self._started -= 1
            self.timeouts += timed_out
            self._cond.notify()

    @staticmethod
    def _kill_all(workers: set[_Worker]) -> None:
        for w in list(workers):
            w.kill()
        workers.clear()


@functools.cache
def default_checker() -> SymbolicChecker:
    """The process's shared checker, made on first use (graders with slime's fixed signatures,
    e.g. `grade_answer_sympy(given, truth)`, have no parameter to receive one; they also accept
    `checker=` to use another)."""
    return SymbolicChecker()
