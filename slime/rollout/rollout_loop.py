"""The synchronous rollout loop: groups generated until `--rollout-batch-size` are kept.

Up to `--over-sampling-batch-size` groups are in flight (extra groups over-provision; with a dynamic
filter a whole over-sampling batch is started each time the kept and generating groups fall short).
Once the target is met the rest is aborted and returned to the buffer (`leftovers`). The group step is
handed in (`generate_group`, slime's `generate_and_rm_group`) so that it stays where slime's plugins patch it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from slime.rollout.base_types import GroupStep, RolloutFnTrainOutput
from slime.rollout.current_rollout import rollout_scope
from slime.rollout.data_source import DataSource
from slime.rollout.filter_hub.base_types import apply_filter, should_drop_dynamic_filter_output
from slime.rollout.flags import RolloutRunConfig
from slime.rollout.leftovers import Leftovers, abort_leftovers
from slime.rollout.runtime import current
from slime.rollout.sampling_params import sampling_params_from_args
from slime.utils.misc import load_function
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

MAX_DROPPED_PER_KEPT = 50  # a filter that drops more than this many groups per wanted group is broken


async def collect_rollout(
    config: RolloutRunConfig, args: Any, rollout_id: int, data_source: DataSource, generate_group: GroupStep
) -> RolloutFnTrainOutput:
    """Generate groups until `--rollout-batch-size` are kept, `--over-sampling-batch-size` in flight
    (extra groups over-provision: the rollout stops as soon as its target is met); then abort the rest
    (bounded by `--abort-timeout`) and return it to the buffer, partial with `--partial-rollout`.
    The groups' tasks know `rollout_id` (segments and sample hooks record it: `current_rollout.py`).
    `config`: `args`' flags, read once for this rollout; `args` goes on to slime's group step, filter and hooks."""
    with rollout_scope(rollout_id):
        return await _collect(config, args, rollout_id, data_source, generate_group)


async def _collect(
    config: RolloutRunConfig, args: Any, rollout_id: int, data_source: DataSource, generate_group: GroupStep
) -> RolloutFnTrainOutput:
    runtime = current(args)
    runtime.client.gate.open()
    rollout = config.rollout
    target = rollout.rollout_batch_size
    over = max(target, int(rollout.over_sampling_batch_size or target))
    stats = runtime.client.stats
    retries_before, failures_before = stats.total_retries, stats.failures
    params = sampling_params_from_args(args)
    filter_fn = (
        load_function(rollout.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path")
        if rollout.dynamic_sampling_filter_path
        else None
    )
    start = time.monotonic()
    kept: list[list[Sample]] = []
    finished: list[list[Sample]] = []  # every group generated this rollout, dropped ones included
    dropped: dict[str, int] = {}
    pending: dict[asyncio.Task, list[Sample]] = {}
    handed_groups: dict[asyncio.Task, list[Sample]] = {}  # every group this rollout took from the data source
    before: dict[asyncio.Task, list[Sample] | None] = {}  # ... and its snapshot (None: fresh prompts)
    settled: set[asyncio.Task] = set()  # dropped by the filter, or already back in the buffer
    leftovers = Leftovers(rollout, rollout_id, data_source)
    # groups as they finish, each put by its own done-callback: waiting on every pending task at each finish
    # (asyncio.wait) costs a callback added and removed per pending group, hundreds per finished group
    finishing: asyncio.Queue[asyncio.Task] = asyncio.Queue()
    abort_time = 0.0
    try:
        while len(kept) < target:
            if len(kept) + len(pending) < target:
                # with a filter: a whole over-sampling batch (slime); without: top up to the over-sampling size
                n = over if filter_fn else over - len(kept) - len(pending)
                for g in data_source.get_samples(n):
                    task = asyncio.ensure_future(generate_group(args, g, params))
                    task.add_done_callback(finishing.put_nowait)
                    pending[task] = handed_groups[task] = g
                    before[task] = leftovers.taken(g)
            if not pending:  # (as asyncio.wait said: nothing was handed out, nothing would ever finish)
                raise ValueError("the data source handed out no group and none is generating")
            done = [await finishing.get()]  # every group finished by now (each is in `pending` until taken here)
            while not finishing.empty():
                done.append(finishing.get_nowait())
            for task in done:
                handed = pending.pop(task)
                group = task.result()
                if any(s.status == Sample.Status.ABORTED for s in group):
                    # an engine aborted it (not us): whole groups only, back it goes
                    settled.add(task)
                    leftovers.finished(group, handed)
                    leftovers.requeued += 1
                    if leftovers.requeued > MAX_DROPPED_PER_KEPT * target:
                        raise RuntimeError(
                            f"the engines aborted {leftovers.requeued} groups while collecting "
                            f"{target}; are they being released or updated in a loop?"
                        )
                    continue
                finished.append(group)
                if filter_fn is not None and len(kept) < target:
                    verdict = apply_filter(filter_fn, args, group)
                    # slime's keep_when_insufficient: a rejected group is kept when dropping it would
                    # leave fewer groups (kept + generating + this one) than the rollout needs
                    if should_drop_dynamic_filter_output(
                        verdict, remaining_batch_size=len(kept) + len(pending) + 1, target_data_size=target
                    ):
                        settled.add(task)
                        dropped[verdict.reason or "filtered"] = dropped.get(verdict.reason or "filtered", 0) + 1
                        if sum(dropped.values()) > MAX_DROPPED_PER_KEPT * target:
                            raise RuntimeError(
                                f"--dynamic-sampling-filter-path dropped {sum(dropped.values())} groups "
                                f"({dropped}) while collecting {target}; the filter rejects (almost) everything"
                            )
                        continue
                if len(kept) < target:
                    kept.append(group)
                else:  # finished after the target was met: kept for a later rollout (partial) or reset
                    settled.add(task)
                    leftovers.finished(group, handed)
    except BaseException:
        # the rollout failed (e.g. a reward function raised): its groups go back as they were handed out
        for task, snap in before.items():
            if task not in pending and task not in settled:
                leftovers.restore(handed_groups[task], snap, interrupted=False)
        raise
    finally:
        if pending:
            abort_time = await abort_leftovers(rollout.abort_timeout, runtime, pending, before, leftovers)
            logger.info("rollout %d: %d leftover group(s) aborted and returned to the buffer", rollout_id, len(pending))
    kept.sort(key=lambda g: g[0].index if g and g[0].index is not None else 0)
    _run_sample_hooks(config, args, kept, finished, data_source)
    elapsed = time.monotonic() - start
    samples = [s for g in kept for s in g]
    tokens = sum(s.response_length for s in samples)
    metrics = {
        "perf/rollout_time": elapsed,
        "perf/tokens_per_s": tokens / max(elapsed, 1e-9),
        "perf/engine_retries": stats.total_retries - retries_before,
        "perf/engine_failures": stats.failures - failures_before,
        **leftovers.metrics(abort_time),
        **{f"rollout/dropped_groups_{k}": v for k, v in dropped.items()},
    }
    return RolloutFnTrainOutput(samples=kept, metrics=metrics)


def _run_sample_hooks(
    config: RolloutRunConfig, args: Any, kept: list[list[Sample]], finished: list[list[Sample]], data_source: Any
) -> None:
    """slime's end-of-rollout hooks (given `args`): the sample filter sees the kept groups, the all-samples
    hook every group generated this rollout (filtered ones too)."""
    if config.rollout_sample_filter_path:  # slime's hook: marks samples remove_sample
        load_function(config.rollout_sample_filter_path, "--rollout-sample-filter-path")(args, kept)
    if config.rollout_all_samples_process_path:  # slime's hook: sees filtered groups too
        load_function(config.rollout_all_samples_process_path, "--rollout-all-samples-process-path")(
            args, finished, data_source
        )
