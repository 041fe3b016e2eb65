"""`--rollout-sample-hook-path` (repeatable), at slime's path: each hook sees every generated sample.

`hook(args, sample, *, rollout_id=None, evaluation=False) -> Sample | None` (sync or async; keyword
arguments it does not declare are not passed). Returning a Sample replaces it; None keeps it.
A hook's `rollout_id` is the caller's, else the one `set_current_rollout_id` set (slime's way), which
is the bound runtime's rollout when there is one and this context's otherwise.
"""

from __future__ import annotations

import inspect
from contextvars import ContextVar
from typing import Any

from slime.rollout.runtime import bound
from slime.utils.misc import load_function
from slime.utils.types import Sample

# the rollout id when no runtime is bound (a plugin run by hand); context-local, not process-global
_unbound_rollout_id: ContextVar[int | None] = ContextVar("slime_sample_hooks_rollout_id", default=None)


def set_current_rollout_id(rollout_id: int | None) -> None:
    """slime's: the rollout the next hooks belong to (the controller sets its runtime's itself)."""
    runtime = bound()
    if runtime is not None:
        runtime.rollout_id = rollout_id
    _unbound_rollout_id.set(rollout_id)


def current_rollout_id() -> int | None:
    runtime = bound()
    if runtime is not None and runtime.rollout_id is not None:
        return runtime.rollout_id
    return _unbound_rollout_id.get()


def _accepted(fn: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


async def _apply(args: Any, sample: Sample, paths: list[str], kwargs: dict[str, Any]) -> Sample:
    for path in paths:
        hook = load_function(path, "--rollout-sample-hook-path")
        out = hook(args, sample, **_accepted(hook, kwargs))
        if inspect.isawaitable(out):
            out = await out
        if out is not None:
            if not isinstance(out, Sample):
                raise TypeError(f"--rollout-sample-hook-path {path!r} returned {type(out).__name__}; "
                                "expected Sample or None")
            sample = out
    return sample


async def apply_rollout_sample_hooks(args: Any, value: Any, **kwargs: Any) -> Any:
    """Apply the configured hooks to every Sample in `value` (a Sample or nested lists), keeping the shape."""
    paths = getattr(args, "rollout_sample_hook_path", None) or []
    if not paths:
        return value
    if kwargs.get("rollout_id") is None:
        kwargs["rollout_id"] = current_rollout_id()
    if isinstance(value, Sample):
        return await _apply(args, value, list(paths), kwargs)
    if isinstance(value, list):
        return [await apply_rollout_sample_hooks(args, v, **kwargs) for v in value]
    raise TypeError(f"rollout sample hooks expect a Sample or a list, got {type(value).__name__}")
