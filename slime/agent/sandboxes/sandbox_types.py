"""The values the sandbox contract (`sandbox.py`) and its backends exchange, in a module of their own so
the backends need not import the contract, which names them (`E2BSandbox`): no import circle."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

EXIT_TIME_BUDGET_EXCEEDED = -1  # exit code of a detached command whose time budget ran out


class ExecResult(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


FileContent = str | bytes | Path
