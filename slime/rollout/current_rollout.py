"""The id of the rollout (or eval) the running code generates for, as a task-local value.

The controller and our rollout loops receive the id as a parameter; slime's plugin signatures
(`generate(args, sample, sampling_params)`, `generate_and_rm_group`, sample hooks) do not carry it. So
where the parameter arrives, `rollout_scope(rollout_id)` sets it in a context variable: asyncio tasks copy
their creator's context, and `async_utils.run` carries the calling thread's into the background loop, so
everything one rollout starts sees that rollout's id, two rollouts running at once each see their own, and
no object holds a value the next rollout overwrites under a running one.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator

_rollout_id: ContextVar[int | None] = ContextVar("slime_rollout_id", default=None)


@contextlib.contextmanager
def rollout_scope(rollout_id: int | None) -> Iterator[None]:
    """Code run inside the block, and the tasks it starts, belong to rollout `rollout_id`."""
    token = _rollout_id.set(rollout_id)
    try:
        yield
    finally:
        _rollout_id.reset(token)


def set_current_rollout_id(rollout_id: int | None) -> None:
    """slime's (`sample_hooks.set_current_rollout_id`): from here on in this context (thread or task),
    and in the tasks it starts, the rollout is `rollout_id`."""
    _rollout_id.set(rollout_id)


def current_rollout_id() -> int | None:
    """The rollout this code runs for (None outside any rollout)."""
    return _rollout_id.get()
