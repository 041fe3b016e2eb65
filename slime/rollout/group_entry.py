"""What the fully-async worker keeps per group: the live samples, how to give them back, the queue.

A group goes back as it was handed out without being copied up front: the entry keeps the live
samples plus `partial_rollout.snapshot` of them (None for fresh prompts, the common case) and gives
them back through `partial_rollout.restore` (fresh prompts are reset in place).
"""

from __future__ import annotations

import copy
import queue

from slime.rollout.partial_rollout import restore, snapshot
from slime.utils.types import Sample


class GroupEntry:
    """A group the worker owns: its id, the samples the data source handed out (generation mutates
    them), their `snapshot` (None: fresh prompts, restored by resetting them), the latest result and
    whether it was continued after a weight update (partial rollout)."""

    __slots__ = ("gid", "handed", "before", "continued", "result")

    def __init__(self, gid: int, handed: list[Sample]):
        self.gid, self.handed, self.before = gid, handed, snapshot(handed)
        self.continued, self.result = False, None

    def as_handed_out(self) -> list[Sample]:
        """The group as the data source handed it out (generation must be over: fresh prompts are
        reset in place)."""
        return restore(self.handed, self.before)[0]

    def copy_as_handed_out(self) -> list[Sample]:
        """A copy of `as_handed_out()` that leaves the live samples alone (generation may go on)."""
        if self.before is not None:
            return snapshot(self.before)
        return restore(copy.deepcopy(self.handed), None)[0]

    def fresh(self, i: int) -> Sample:
        """Sample `i` as handed out, to start again (its live sample is reset in place when it was a
        fresh prompt, else a copy of its snapshot)."""
        if self.before is None:
            return restore([self.handed[i]], None)[0][0]
        copied = snapshot([self.before[i]])
        return copied[0] if copied is not None else restore([self.handed[i]], None)[0][0]


class CompletedQueue(queue.Queue):
    """Finished groups as `(gid, group)`, oldest first; thread-safe and unbounded (see the module
    docstring)."""

    def items(self) -> list[tuple[int, list[Sample]]]:
        with self.mutex:
            return list(self.queue)
