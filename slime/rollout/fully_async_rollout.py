"""Fully-async rollout at slime's path: `--rollout-function-path
slime.rollout.fully_async_rollout.generate_rollout_fully_async`.

A worker keeps up to `--sglang-server-concurrency` x engines groups generating across rollout
boundaries, so a rollout takes groups that finished while the trainer was busy and the slowest
sample of one rollout never holds up the next. Each group goes through `generate_and_rm_group`
(so `--custom-generate-function-path` and `--custom-rm-path` apply unchanged).

Unlike slime's worker (a thread polling its own event loop every second), ours runs on the
process's shared loop and is driven by completions: a finished group tops the pool up and wakes the
rollout waiting for it. Nothing is lost or hangs: a group with an aborted sample goes back to the
data source, a group whose generation raises goes back too and the rollout fails with that error
(instead of logging it forever), and a data source that runs dry before the batch is full is an
error naming how many groups were collected. Groups finished beyond a rollout's batch stay queued
for the next one. One worker per runtime and data source (`RolloutRuntime.shared`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from typing import Any

from slime.rollout.base_types import RolloutFnTrainOutput
from slime.rollout.runtime import RolloutRuntime, current
from slime.rollout.sglang_rollout import generate_and_rm_group, generate_rollout, sampling_params_from_args
from slime.utils.async_utils import run
from slime.utils.endpoints import rollout_num_engines as get_rollout_num_engines
from slime.utils.types import Sample

__all__ = ["AsyncRolloutWorker", "generate_rollout_fully_async"]

logger = logging.getLogger(__name__)


class AsyncRolloutWorker:
    """The pool of groups in flight and the queue of finished ones; lives on the shared loop."""

    def __init__(self, args: Any, data_source: Any, runtime: RolloutRuntime, concurrency: int):
        self.args, self.data_source, self.runtime = args, data_source, runtime
        self.concurrency = max(1, int(concurrency))
        self.sampling_params = sampling_params_from_args(args)
        # each task's group as handed out (pristine copy): what goes back to the data source
        self.active: dict[asyncio.Task, list[Sample]] = {}
        self.completed: list[list[Sample]] = []
        self.requeued_aborted = 0
        self.error: BaseException | None = None
        self._changed: asyncio.Event | None = None

    def queue_size(self) -> int:
        return len(self.completed)

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _top_up(self) -> None:
        # backpressure: groups in flight plus finished-but-untaken never exceed the pool size
        while self.error is None and len(self.active) + len(self.completed) < self.concurrency:
            groups = self.data_source.get_samples(1)
            if not groups:
                return
            for group in groups:
                pristine = copy.deepcopy(group)
                task = asyncio.ensure_future(generate_and_rm_group(self.args, group, dict(self.sampling_params),
                                                                   runtime=self.runtime))
                self.active[task] = pristine
                task.add_done_callback(self._on_done)

    def _on_done(self, task: asyncio.Task) -> None:
        group = self.active.pop(task)
        if task.cancelled():
            self.data_source.add_samples([group])
        elif task.exception() is not None:
            self.data_source.add_samples([group])
            if self.error is None:
                self.error = task.exception()
        else:
            result = task.result()
            if any(s.status == Sample.Status.ABORTED for s in result):
                self.requeued_aborted += 1
                self.data_source.add_samples([group])
            else:
                self.completed.append(result)
        self._event().set()
        self._top_up()

    async def take(self, n: int) -> list[list[Sample]]:
        """The first `n` finished groups (waiting for them); the rest stay queued."""
        self._top_up()
        while len(self.completed) < n:
            if self.error is not None:
                error, self.error = self.error, None
                raise error
            if not self.active:
                raise RuntimeError(f"fully-async rollout: the data source has no more prompts; collected "
                                   f"{len(self.completed)} of {n} groups (--prompt-data, --num-epoch)")
            event = self._event()
            event.clear()
            await event.wait()
        out, self.completed = self.completed[:n], self.completed[n:]
        self._top_up()
        return out

    async def stop(self) -> None:
        """Cancel what is in flight (its prompts go back to the data source); queued groups are kept."""
        self.error = self.error or RuntimeError("fully-async worker stopped")  # no more top-ups
        tasks = list(self.active)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _worker(args: Any, data_source: Any, runtime: RolloutRuntime) -> AsyncRolloutWorker:
    concurrency = (getattr(args, "sglang_server_concurrency", None) or 512) * max(1, get_rollout_num_engines(args))
    return runtime.shared(f"fully_async_rollout.worker:{id(data_source)}",
                          lambda: AsyncRolloutWorker(args, data_source, runtime, concurrency))


async def _generate_rollout_async(args: Any, rollout_id: int, data_source: Any,
                                  runtime: RolloutRuntime) -> RolloutFnTrainOutput:
    worker = _worker(args, data_source, runtime)
    start, warm = time.monotonic(), worker.queue_size()
    groups = await worker.take(args.rollout_batch_size)
    groups.sort(key=lambda g: min((s.index for s in g if s.index is not None), default=0))
    elapsed = time.monotonic() - start
    logger.info("fully-async rollout %d: %d groups in %.1fs (%d were ready), %d queued, %d in flight", rollout_id,
                len(groups), elapsed, warm, worker.queue_size(), len(worker.active))
    return RolloutFnTrainOutput(samples=groups, metrics={
        "perf/rollout_time": elapsed, "rollout/fully_async_ready_at_start": warm,
        "rollout/fully_async_queue_left": worker.queue_size(), "rollout/fully_async_in_flight": len(worker.active),
        "rollout/fully_async_requeued_aborted": worker.requeued_aborted})


def generate_rollout_fully_async(args: Any, rollout_id: int, data_buffer: Any, evaluation: bool = False, *,
                                 runtime: RolloutRuntime | None = None):
    """slime's rollout-function contract; evaluation runs the default (synchronous) eval."""
    runtime = runtime or current(args)
    if evaluation:
        return generate_rollout(args, rollout_id, data_buffer, evaluation=True, runtime=runtime)
    return run(_generate_rollout_async(args, rollout_id, data_buffer, runtime))
