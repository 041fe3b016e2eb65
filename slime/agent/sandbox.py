"""slime's import path for the sandbox contract (`sandbox_contract.py`) and its `E2BSandbox`.

`E2BSandbox` (slime's backend, or ours with SLIME_AGENT_SANDBOX_BACKEND=slime: `sandbox_backend.py`)
loads lazily, so the `e2b` package is needed only by whoever uses it. The backends import the contract
itself, not this file, so choosing a backend here makes no import circle.
"""

from __future__ import annotations

from typing import Any

from slime.agent.sandbox_contract import (EXIT_TIME_BUDGET_EXCEEDED, MARKER_POLL_SECONDS, ExecResult,
                                          FileContent, RunsToEnd, Sandbox, ensure_agent_user, exec_and_wait)

__all__ = [  # E2BSandbox is named on access only (a star import must not load a backend)
    "EXIT_TIME_BUDGET_EXCEEDED", "MARKER_POLL_SECONDS", "ExecResult", "FileContent", "RunsToEnd", "Sandbox",
    "ensure_agent_user", "exec_and_wait"]


def __getattr__(name: str) -> Any:
    if name == "E2BSandbox":  # lazily: importing the contract must not need the e2b backend
        from slime.agent.sandbox_backend import e2b_class

        return e2b_class()  # slime's E2B backend, or ours (SLIME_AGENT_SANDBOX_BACKEND=slime)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
