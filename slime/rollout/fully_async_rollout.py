"""Fully-async rollout at slime's path: `--rollout-function-path
slime.rollout.fully_async_rollout.generate_rollout_fully_async`.

A worker keeps up to `--sglang-server-concurrency` x engines groups generating across rollout
boundaries (finished-but-untaken groups count against that pool, so it never runs ahead of the
trainer by more than one pool), so a rollout takes groups that finished while the trainer was busy
and the slowest sample of one rollout never holds up the next. Each group goes through
`generate_and_rm_group` (so `--custom-generate-function-path` and `--custom-rm-path` apply).

Unlike slime's worker (a thread polling its own event loop every second), ours runs on the
process's shared loop and is driven by completions: a finished group tops the pool up and wakes the
rollout waiting for it. Rules, all per whole group (a group is never split between rollouts):
- `--dynamic-sampling-filter-path` sees each finished group once; dropped groups are counted.
- `--max-staleness K`: a finished group in which a sample's oldest segment (`weight_versions[0]`)
  is more than K versions behind the current weight version is dropped and its prompts go back to
  the data source fresh; checked when it finishes, after every weight update and when a rollout
  takes it. The current version is the newest of what the trainer announced
  (`WorkerHub.resume(version)`, from `RolloutManager.end_weight_update`) and what answers carried.
- Weight updates (`WorkerHub.pause` / `resume`): no group is started while weights change. With
  `--partial-rollout` the requests in flight are aborted (SGLang's pause with abort) and their groups
  kept with the tokens so far, then continued under the new weights (a continued group is not
  dropped for staleness: that is what partial rollout is for; `--mask-offpolicy-in-partial-rollout`
  keeps its old tokens out of the loss). Without it they stay on the engines, which the trainer's
  push pauses in place.
- Nothing is lost: a group with an aborted sample (not ours to continue) goes back to the data
  source; a group whose generation raises goes back too and the rollout fails with that error; a
  data source that runs dry is an error naming how many groups were collected; `stop()` aborts
  everything in flight and returns it, and the queued groups, to the data source. A group goes back
  as it was handed out, without being copied up front (`group_entry.GroupEntry`).
One worker per runtime and data source, all of a runtime's workers in one `WorkerHub` (`worker_hub.py`;
weight versions and staleness in `weight_versions.py`).

slime's names are kept where its tests and users reach them: `AsyncRolloutWorker(args, data_buffer,
concurrency=)` with `output_queue` (finished `(gid, group)` pairs, unbounded: backpressure is in
`_top_up`, so a done callback never blocks), `get_completed_groups(limit)`, `queue_size()`,
`_make_done_cb(gid)`, `start()` / `stop()`; `GenerateState` and `generate_and_rm_group` looked up
here at call time; `_get_global_worker(args, data_buffer)` and `_generate_rollout_async(args,
rollout_id, data_buffer) -> list[list[Sample]]`. `poll_interval` exists but nothing polls.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import time
from collections import Counter
from typing import Any

from slime.rollout.base_types import RolloutFnTrainOutput
from slime.rollout.current_rollout import current_rollout_id, rollout_scope
from slime.rollout.filter_hub.base_types import apply_filter, should_drop_dynamic_filter_output
from slime.rollout.group_entry import CompletedQueue, GroupEntry
from slime.rollout.runtime import current
from slime.rollout.sglang_rollout import GenerateState, generate_and_rm_group, generate_rollout
from slime.rollout.weight_versions import staleness, version_number
from slime.rollout.worker_hub import WorkerHub, worker_hub
from slime.utils.async_utils import get_loop, run
from slime.utils.endpoints import rollout_num_engines as get_rollout_num_engines
from slime.utils.misc import load_function
from slime.utils.types import Sample
from slime.utils.plugin_args import completed

__all__ = ["AsyncRolloutWorker", "WorkerHub", "generate_rollout_fully_async", "worker_hub"]

logger = logging.getLogger(__name__)

MAX_DROPPED_PER_KEPT = 50  # a filter dropping this many groups per wanted group in a row is broken


class AsyncRolloutWorker:
    """The pool of groups in flight and the queue of finished ones; lives on the shared loop (every
    method but `start`/`stop` runs there, so no lock; the output queue is thread-safe anyway)."""

    def __init__(self, args: Any, data_buffer: Any, concurrency: int = 10, *, hub: "WorkerHub | None" = None):
        args = completed(args)
        self.args, self.data_source = args, data_buffer
        self.hub = hub or WorkerHub()
        # at least one rollout's worth of groups, or a rollout would wait for groups never started
        self.concurrency = max(1, int(concurrency), int(args.rollout_batch_size))
        self.state = GenerateState(args)
        # slime's keys include stop/stop_token_ids as None when unset; an engine gets only set ones
        self.sampling_params = {k: v for k, v in self.state.sampling_params.items() if v is not None}
        self.output_queue = CompletedQueue()
        self.poll_interval = 1.0  # slime's attribute; nothing polls here (completions drive the pool)
        self._entries: dict[int, GroupEntry] = {}  # gid -> entry of each group in output_queue
        self._gids = itertools.count()
        self.max_staleness = args.max_staleness
        self.partial = bool(args.partial_rollout)
        self.abort_timeout = args.abort_timeout
        path = args.dynamic_sampling_filter_path
        self.filter_fn = load_function(path, "--dynamic-sampling-filter-path") if path else None
        self.active: dict[asyncio.Task, GroupEntry] = {}
        self.suspended: list[GroupEntry] = []  # aborted by a weight update, continued when it ends
        self.paused = self.hub.paused
        self.closed = False
        self.counters: Counter = Counter()  # cumulative; each rollout reports what changed since the last
        self._reported: Counter = Counter()
        self._dropped_in_a_row = 0
        # the rollout the groups it starts are for (their segments and sample hooks see it): the one that
        # last took groups; a group outlives rollouts, so the worker, not the caller's context, says which
        self.rollout_id = current_rollout_id()
        self.error: BaseException | None = None
        self._changed = asyncio.Event()

    # ---- state ----
    @property
    def current_version(self) -> int | None:
        return self.hub.version

    @property
    def requeued_aborted(self) -> int:
        return self.counters["requeued_aborted"]

    @property
    def data_buffer(self) -> Any:  # slime's name
        return self.data_source

    def queue_size(self) -> int:
        return self.output_queue.qsize()

    def get_completed_groups(self, limit: int | None = None) -> list[tuple[int, list[Sample]]]:
        """Take up to `limit` finished `(gid, group)` pairs, oldest first (all when None); the rest stay."""
        out: list[tuple[int, list[Sample]]] = []
        while limit is None or len(out) < limit:
            try:
                out.append(self.output_queue.get_nowait())
            except queue.Empty:
                break
        return out

    def _take_entries(self, limit: int | None = None) -> list[GroupEntry]:
        """Like `get_completed_groups`, as entries (a group put in by hand gets one)."""
        return [
            self._entries.pop(gid, None) or self._adopt(gid, group) for gid, group in self.get_completed_groups(limit)
        ]

    def _adopt(self, gid: int, group: list[Sample]) -> GroupEntry:
        entry = GroupEntry(gid, group)
        entry.result = group
        return entry

    def _complete(self, entry: GroupEntry) -> None:
        self._entries[entry.gid] = entry
        self.output_queue.put((entry.gid, entry.result))

    def in_flight(self) -> int:
        return len(self.active)

    def _wake(self) -> None:
        self._changed.set()

    async def settled(self) -> None:
        """Wait until no group is generating (the pool is full, paused, stopped or out of prompts)."""
        while self.active:
            self._changed.clear()
            await self._changed.wait()

    # ---- generating ----
    def _launch(self, group: list[Sample], entry: GroupEntry) -> None:
        with rollout_scope(self.rollout_id):  # the task copies it (a completion's callback has the old one)
            task = asyncio.ensure_future(generate_and_rm_group(self.args, group, dict(self.sampling_params), False))
        self.active[task] = entry
        task.add_done_callback(self._make_done_cb(entry.gid))

    def _top_up(self) -> None:
        # backpressure: groups in flight, suspended and finished-but-untaken never exceed the pool size
        while (
            not self.paused
            and not self.closed
            and self.error is None
            and len(self.active) + self.queue_size() + len(self.suspended) < self.concurrency
        ):
            groups = self.data_source.get_samples(1)
            if not groups:
                return
            for group in groups:
                self.counters["groups_started"] += 1
                self._launch(group, GroupEntry(next(self._gids), group))

    def start(self) -> None:
        """slime's: start filling the pool (on the shared loop; completions keep it full)."""
        get_loop().call_soon_threadsafe(self._top_up)

    def stop(self) -> dict[str, int]:
        """slime's, from any thread but the shared loop's: `close()` and wait for it."""
        return run(self.close())

    def _give_back(self, entry: GroupEntry | None, reason: str) -> None:
        """The group goes back to the data source as it was handed out (served before new prompts)."""
        if entry is None:  # a task this worker did not start: nothing of ours to give back
            return
        self.data_source.add_samples([entry.as_handed_out()])
        self.counters[f"returned_{reason}"] += 1

    def _observe_versions(self, group: list[Sample]) -> None:
        seen = [
            v for s in group for v in map(version_number, getattr(s, "weight_versions", None) or []) if v is not None
        ]
        if seen:
            self.hub.observe(max(seen))

    def _make_done_cb(self, gid: int):
        """slime's: the callback a group's task calls when it ends (never blocks)."""
        return lambda task: self._on_done(task, gid)

    def _on_done(self, task: Any, gid: int) -> None:
        entry = self.active.pop(task, None)
        try:
            try:
                result = task.result()
            except asyncio.CancelledError:
                self._give_back(entry, "cancelled")
            except Exception as e:  # noqa: BLE001 - the group goes back; the next take() raises it
                self._give_back(entry, "error")
                if self.error is None and not self.closed:
                    self.error = e
            else:
                self._finished(entry or GroupEntry(gid, result), result)
        finally:
            self._wake()
            self._top_up()

    def _finished(self, entry: GroupEntry, result: list[Sample]) -> None:
        self._observe_versions(result)
        if self.closed:
            self._give_back(entry, "stopped")
            return
        if any(s.status == Sample.Status.ABORTED for s in result):
            if self.partial and self.paused:
                entry.result = result
                self.suspended.append(entry)  # continued when the weight update ends
            elif self.partial:
                self._continue(entry, result)  # aborted by someone else: continue now
            else:
                self.counters["requeued_aborted"] += 1
                self._give_back(entry, "aborted")
            return
        entry.result = result
        if self._too_stale(entry):
            self._drop_stale(entry)
            return
        if self.filter_fn is not None and not self._passes_filter(entry):
            return
        self._complete(entry)

    def _passes_filter(self, entry: GroupEntry) -> bool:
        verdict = apply_filter(self.filter_fn, self.args, entry.result)
        # slime's keep_when_insufficient: kept when the pool could not otherwise fill a rollout
        if not should_drop_dynamic_filter_output(
            verdict,
            remaining_batch_size=self.queue_size() + len(self.active) + 1,
            target_data_size=int(self.args.rollout_batch_size),
        ):
            self._dropped_in_a_row = 0
            return True
        reason = verdict.reason or "filtered"
        self.counters[f"dropped_groups_{reason}"] += 1
        self._dropped_in_a_row += 1
        if self._dropped_in_a_row > MAX_DROPPED_PER_KEPT * int(self.args.rollout_batch_size) and self.error is None:
            self.error = RuntimeError(
                f"--dynamic-sampling-filter-path dropped {self._dropped_in_a_row} groups in a row "
                f"({reason}); the filter rejects (almost) everything"
            )
        return False

    def _continue(self, entry: GroupEntry, result: list[Sample]) -> None:
        """Launch an aborted group again: samples with tokens are continued by
        `generate_and_rm_group` (--partial-rollout), those without start afresh."""
        group = (
            [
                s if s.response_length > 0 or s.status != Sample.Status.ABORTED else entry.fresh(i)
                for i, s in enumerate(result)
            ]
            if len(result) == len(entry.handed)
            else result
        )
        for s in group:
            if s.status == Sample.Status.ABORTED:
                s.reward = None  # scored when it finishes
        entry.continued, entry.result = True, None
        self.counters["continued_groups"] += 1
        self.counters["continued_samples"] += sum(
            s.status == Sample.Status.ABORTED and s.response_length > 0 for s in result
        )
        self._launch(group, entry)

    # ---- staleness ----
    def _too_stale(self, entry: GroupEntry) -> bool:
        if self.max_staleness is None or entry.continued or entry.result is None:
            return False
        current = self.current_version
        return any((staleness(s, current) or 0) > self.max_staleness for s in entry.result)

    def _drop_stale(self, entry: GroupEntry) -> None:
        self.counters["stale_dropped"] += len(entry.result or entry.handed)
        self.counters["stale_dropped_groups"] += 1
        self._give_back(entry, "stale")

    def _enforce_staleness(self) -> None:
        if self.max_staleness is None or not self.queue_size():
            return
        dropped = 0
        for entry in self._take_entries():  # all of them, put back in order unless too stale
            if self._too_stale(entry):
                self._drop_stale(entry)
                dropped += 1
            else:
                self._complete(entry)
        if dropped:
            self._top_up()

    # ---- weight updates ----
    async def pause(self) -> None:
        """A weight update starts: no new group; with --partial-rollout, abort what is in flight
        and keep it (with its tokens) to continue under the new weights."""
        self.paused = True
        if self.partial and self.active:
            await self._abort_in_flight()

    async def resume(self) -> None:
        """The weight update is over: continue the suspended groups, drop what became too stale,
        top the pool up."""
        self.paused = False
        suspended, self.suspended = self.suspended, []
        for entry in suspended:  # the oldest work first
            self._continue(entry, entry.result)
        self._enforce_staleness()
        self._top_up()
        self._wake()

    async def _abort_in_flight(self) -> None:
        """Abort every request on the engines, give the groups `--abort-timeout` seconds to come
        back with their partial answers, then cancel what is left (its prompts go back fresh)."""
        client = current(self.args).client
        gate = client.gate
        gate.close()  # nothing new leaves while the engines abort (requests waiting for a slot included)
        try:
            _, late = await client.abort_until_settled(set(self.active), self.abort_timeout)
        finally:
            gate.open()
        for task in late:
            task.cancel()
        if late:
            await asyncio.gather(*late, return_exceptions=True)
            self.counters["cancelled_after_abort"] += len(late)

    # ---- rollouts ----
    async def take(self, n: int) -> list[list[Sample]]:
        """The first `n` finished groups (waiting for them); the rest stay queued."""
        self.rollout_id = current_rollout_id()  # the caller's rollout: groups started from now on are its
        self._top_up()
        while True:
            self._enforce_staleness()
            if self.queue_size() >= n:
                break
            if self.error is not None:
                error, self.error = self.error, None
                raise error
            if self.closed:
                raise RuntimeError("fully-async rollout: the worker was stopped")
            if not self.active and not self.paused and not self.suspended:
                raise RuntimeError(
                    f"fully-async rollout: the data source has no more prompts; collected "
                    f"{self.queue_size()} of {n} groups (--prompt-data, --num-epoch)"
                )
            self._changed.clear()
            await self._changed.wait()
        out = self._take_entries(n)
        self._top_up()
        return [e.result for e in out]

    def metrics_since_last(self) -> dict[str, float]:
        """Counters of what happened since the previous call (one rollout's share)."""
        delta = self.counters - self._reported
        self._reported = Counter(self.counters)
        return {key: delta.get(key, 0) for key in set(self.counters)}

    def held_groups(self) -> list[list[Sample]]:
        """Fresh copies of every group this worker holds (generating, suspended, finished and not yet
        taken), as the data source handed them out."""
        return [
            e.copy_as_handed_out()
            for e in [
                *self.active.values(),
                *self.suspended,
                *(self._entries.get(gid) or self._adopt(gid, group) for gid, group in self.output_queue.items()),
            ]
        ]

    async def close(self) -> dict[str, int]:
        """Abort everything in flight; it, the suspended and the queued groups go back to the data
        source. Returns how many groups went back; no task of this worker is left running."""
        self.closed = True
        before = sum(v for k, v in self.counters.items() if k.startswith("returned_"))
        if self.active:
            await self._abort_in_flight()
        for entry in self.suspended + self._take_entries():
            self._give_back(entry, "stopped")
        self.suspended = []
        assert not self.active, f"fully-async worker stopped with {len(self.active)} task(s) still running"
        self._wake()
        return {"returned_groups": sum(v for k, v in self.counters.items() if k.startswith("returned_")) - before}


def _get_global_worker(args: Any, data_buffer: Any) -> AsyncRolloutWorker:
    """slime's name: the worker of this process's runtime for `data_buffer`, created on first use with
    a pool of `--sglang-server-concurrency` x engines groups."""
    runtime = current(args)
    concurrency = args.sglang_server_concurrency * max(1, get_rollout_num_engines(args))
    hub = worker_hub(runtime)
    return runtime.shared(
        f"fully_async_rollout.worker:{id(data_buffer)}",
        lambda: hub.add(AsyncRolloutWorker(args, data_buffer, concurrency, hub=hub)),
    )


async def _rollout(args: Any, rollout_id: int, data_buffer: Any) -> RolloutFnTrainOutput:
    worker = _get_global_worker(args, data_buffer)
    start, warm = time.monotonic(), worker.queue_size()
    with rollout_scope(rollout_id):
        groups = await worker.take(args.rollout_batch_size)
    groups.sort(key=lambda g: min((s.index for s in g if s.index is not None), default=0))
    elapsed = time.monotonic() - start
    current_version = worker.current_version
    ages = [a for g in groups for s in g if (a := staleness(s, current_version)) is not None]
    counts = worker.metrics_since_last()
    logger.info(
        "fully-async rollout %d: %d groups in %.1fs (%d were ready), %d queued, %d in flight, "
        "version %s, %d stale dropped",
        rollout_id,
        len(groups),
        elapsed,
        warm,
        worker.queue_size(),
        len(worker.active),
        current_version,
        counts.get("stale_dropped", 0),
    )
    metrics = {
        "perf/rollout_time": elapsed,
        "rollout/fully_async_ready_at_start": warm,
        "rollout/fully_async_queue_left": worker.queue_size(),
        "rollout/fully_async_in_flight": len(worker.active),
        "rollout/fully_async_requeued_aborted": counts.get("requeued_aborted", 0),
        "rollout/stale_dropped": counts.get("stale_dropped", 0),
        "rollout/stale_dropped_groups": counts.get("stale_dropped_groups", 0),
        "rollout/mean_staleness": sum(ages) / len(ages) if ages else 0.0,
        "rollout/max_staleness": max(ages) if ages else 0,
        "rollout/fully_async_continued_groups": counts.get("continued_groups", 0),
        "rollout/fully_async_cancelled_after_abort": counts.get("cancelled_after_abort", 0),
    }
    if current_version is not None:
        metrics["rollout/weight_version"] = current_version
    metrics.update({f"rollout/{k}": v for k, v in counts.items() if k.startswith("dropped_groups_")})
    return RolloutFnTrainOutput(samples=groups, metrics=metrics)


async def _generate_rollout_async(args: Any, rollout_id: int, data_buffer: Any) -> list[list[Sample]]:
    """slime's: the `--rollout-batch-size` oldest finished groups; the rest stay queued."""
    args = completed(args)
    return (await _rollout(args, rollout_id, data_buffer)).samples


def generate_rollout_fully_async(args: Any, rollout_id: int, data_buffer: Any, evaluation: bool = False):
    """slime's rollout-function contract (slime's four parameters; the runtime is the bound one);
    evaluation runs the default (synchronous) eval, where slime refuses."""
    args = completed(args)
    if evaluation:
        return generate_rollout(args, rollout_id, data_buffer, evaluation=True)
    return run(_rollout(args, rollout_id, data_buffer))
