"""Where the groups a rollout does not keep go, and the abort of those still generating.

A synchronous rollout stops as soon as it has its target; the groups it over-provisioned are then
aborted on the engines (at most `--abort-timeout` seconds, then cancelled) and go back to the data
source, so nothing is lost: partial (continued later, `partial_rollout`) with `--partial-rollout`,
else reset to their prompts (their tokens counted as wasted). `Leftovers` also counts what that cost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from slime.rollout import partial_rollout as partial
from slime.rollout.flags import RolloutConfig
from slime.rollout.runtime import RolloutRuntime
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


def _reset(sample: Sample) -> Sample:
    """Back to a fresh prompt, so a recycled group is generated from scratch."""
    partial.reset_sample(sample)
    return sample


class Leftovers:
    """Where the groups a rollout does not keep go, and what that cost (the rollout's abort metrics).

    With `--partial-rollout` an interrupted group goes back as it is (finished samples kept, unfinished
    ones ABORTED with their partial response); without it, to its prompt, its tokens counted as wasted.
    A group whose generation was cancelled (past `--abort-timeout`) or failed goes back as the rollout
    took it (its snapshot, taken by `taken`); what it generated meanwhile is wasted.
    """

    def __init__(self, config: RolloutConfig, rollout_id: int, data_source: Any):
        self.rollout_id, self.data_source = rollout_id, data_source
        self.partial = config.partial_rollout
        self.aborted_samples = self.wasted_tokens = self.requeued = self.continued = 0

    def taken(self, group: list[Sample]) -> list[Sample] | None:
        """A group handed out to generate: its snapshot, to put back as it was if its generation is
        cancelled or fails (None for fresh prompts); with --partial-rollout, its continuations counted."""
        if self.partial:
            self.continued += sum(s.is_partial for s in group)  # continues an earlier rollout's answer
        return partial.snapshot(group)

    def finished(self, group: list[Sample], handed: list[Sample]) -> None:
        """A group whose generation ended but that the rollout does not keep."""
        self.aborted_samples += partial.unfinished(group)
        same = len(group) == len(handed) and all(a is b for a, b in zip(group, handed))
        if self.partial and same:
            self.data_source.add_samples([partial.keep_partial_group(group, self.rollout_id)])
        else:  # no partial rollout, or a custom function returned other samples (fan-out): start again
            self.wasted_tokens += sum(s.response_length for s in group)
            self.data_source.add_samples([[_reset(s) for s in handed]])

    def restore(self, group: list[Sample], before: list[Sample] | None, *, interrupted: bool) -> None:
        """A group whose generation was cancelled or failed: back as it was handed out."""
        if interrupted:
            self.aborted_samples += len(group) - sum(self.partial and partial.is_finished(b) for b in before or [])
        back, wasted = partial.restore(group, before)
        self.wasted_tokens += wasted
        self.data_source.add_samples([back if self.partial else [_reset(s) for s in back]])

    def metrics(self, abort_time: float) -> dict[str, Any]:
        return {
            "rollout/aborted_samples": self.aborted_samples,
            "rollout/continued_samples": self.continued,
            "rollout/wasted_tokens": self.wasted_tokens,
            "perf/abort_time": abort_time,
        }


async def abort_leftovers(
    abort_timeout: float,
    runtime: RolloutRuntime,
    pending: dict[asyncio.Task, list[Sample]],
    before: dict[asyncio.Task, list[Sample] | None],
    leftovers: Leftovers,
) -> float:
    """Abort what is still generating, wait at most --abort-timeout for the engines' partial answers,
    cancel the rest; every group goes back to the buffer. Returns the seconds it took."""
    start = time.monotonic()
    gate = runtime.client.gate
    gate.close()  # no new request (a multi-turn sample between turns stops here)
    done: set[asyncio.Task] = set()
    late: set[asyncio.Task] = set(pending)
    try:
        done, late = await runtime.client.abort_until_settled(set(pending), abort_timeout)
    finally:
        # even when the abort itself failed or was cancelled: nothing keeps running, every group goes back
        for task in late:
            task.cancel()
        try:
            await asyncio.gather(*late, return_exceptions=True)
        finally:
            gate.open()
            for task, group in pending.items():
                if task in done and not task.cancelled() and task.exception() is None:
                    leftovers.finished(task.result(), group)
                else:
                    leftovers.restore(group, before[task], interrupted=True)
    if late:
        logger.warning(
            "rollout: %d group(s) did not answer the abort within --abort-timeout %ss; cancelled and "
            "returned to the buffer as they were handed out",
            len(late),
            abort_timeout,
        )
    return time.monotonic() - start
