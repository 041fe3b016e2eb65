"""slime's path for the bounded symbolic checker of math answers; the code lives in
`slime.utils.math_grading.symbolic` (tools grade math answers too, and sit below rollout)."""

from __future__ import annotations

from slime.utils.math_grading.symbolic import _WORKER, SymbolicChecker, _Worker, default_checker

__all__ = ["SymbolicChecker", "default_checker", "_Worker", "_WORKER"]
