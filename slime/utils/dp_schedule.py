"""slime's `build_dp_schedule` at `slime.utils.dp_schedule`: which DP rank trains which samples, in
which micro-batches. A shim over our schedule (`slime.train_batch.schedule`, pure Python, below utils):
same invariants, same 4-tuple, slime's AssertionError on a rollout that cannot be scheduled.

With `balance_data` ranks are balanced by forward FLOPs (`slime.train_batch.flops`), as slime's schedule
does; without it by tokens (slime deals micro-batches round-robin there). Ours always balances the
ranks first (see the schedule's docstring), so partitions may differ from slime's while every
invariant holds.

slime's signature takes `args`; it reads the flags once as our `TrainBatchConfig` (completing a namespace slime's
callers built by hand with the parser's defaults) and reads nothing else off it.
"""

from __future__ import annotations

from typing import Any


def build_dp_schedule(
    args: Any,
    train_parallel_config: dict,
    total_lengths: list[int],
    *,
    global_batch_size: int,
    rollout_indices: list[int],
) -> tuple[list[list[int]], list[list[list[int]]], list[int], list[int]]:
    """`(partitions, micro_batch_indices, num_microbatches, global_batch_sizes)` of one rollout;
    `global_batch_size` counts rollouts (samples sharing `rollout_indices[i]` stay in one step)."""
    from slime.train_batch.flags import TrainBatchConfig
    from slime.train_batch.schedule import ScheduleError, schedule_from_flags
    from slime.utils.plugin_args import completed

    config = TrainBatchConfig.from_args(completed(args))  # slime's callers and tests build it by hand
    try:
        sched = schedule_from_flags(
            config,
            total_lengths,
            rollout_indices,
            global_batch_size=global_batch_size,
            parallel_config=train_parallel_config,
        )
    except ScheduleError as e:  # slime's contract: an assertion
        raise AssertionError(str(e)) from e
    return sched.partitions, sched.micro_batch_indices, sched.num_microbatches, sched.global_batch_sizes
