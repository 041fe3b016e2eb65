"""`--rollout-sample-hook-path` (repeatable), at slime's path: each hook sees every generated sample.

`hook(args, sample, *, rollout_id=None, evaluation=False) -> Sample | None` (sync or async; keyword
arguments it does not declare are not passed). Returning a Sample replaces it; None keeps it.
A hook's `rollout_id` is the caller's, else the rollout this code runs for (`current_rollout.py`: set
where the rollout id is passed in, or by slime's `set_current_rollout_id`).
"""

from __future__ import annotations

import inspect
from typing import Any

from slime.rollout.current_rollout import current_rollout_id, set_current_rollout_id  # noqa: F401 - slime's names
from slime.utils.misc import load_function
from slime.utils.types import Sample
from slime.utils.plugin_args import completed


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
                raise TypeError(
                    f"--rollout-sample-hook-path {path!r} returned {type(out).__name__}; expected Sample or None"
                )
            sample = out
    return sample


async def apply_rollout_sample_hooks(args: Any, value: Any, **kwargs: Any) -> Any:
    """Apply the configured hooks to every Sample in `value` (a Sample or nested lists), keeping the shape."""
    args = completed(args)
    paths = args.rollout_sample_hook_path or []
    if not paths:
        return value
    if kwargs.get("rollout_id") is None:
        kwargs["rollout_id"] = current_rollout_id()
    if isinstance(value, Sample):
        return await _apply(args, value, list(paths), kwargs)
    if isinstance(value, list):
        return [await apply_rollout_sample_hooks(args, v, **kwargs) for v in value]
    raise TypeError(f"rollout sample hooks expect a Sample or a list, got {type(value).__name__}")
