"""One training batch per data-parallel rank, in the layout slime's trainer reads from its `Box`.

`RolloutManager.generate` calls `split_for_data_parallel(config, batch, parallel_config)` on the output
of `convert_samples_to_train_data` once `set_train_parallel_config` was called, and `ray.put`s each
rank's dict; `config` is the `TrainBatchConfig` its controller read once from the namespace. A slime trainer
(`process_rollout_data`, `DataIterator`, `get_batch`) consumes it as is.

Per-rank dict:

| key | value |
|---|---|
| `partition` | list[int]: this rank's samples, as positions in the whole rollout, in training order |
| per-sample keys | the batch's lists restricted to `partition` (same order) |
| `raw_reward`, `total_lengths` | lists for the *whole* rollout (the trainer indexes them with `partition`) |
| `global_batch_sizes` | list[int]: rollouts per training step |
| `num_microbatches` | list[int]: micro-batches per rank per step (equal on every rank) |
| `micro_batch_indices` | list[list[int]]: micro-batches as indices into this rank's lists |

Tensors (CPU, contiguous, one per sample): `tokens` int64; `loss_masks` int32; `rollout_log_probs`
and `teacher_log_probs` float32; `rollout_top_p_token_ids`/`_offsets` int32; `rollout_routed_experts`
keeps its dtype; arrays/tensors inside `multimodal_train_inputs` become CPU tensors. `rollout_mask_sums`
is one float32 tensor of the rank's samples. Everything else stays a plain list.
"""

from __future__ import annotations

import array
import logging
from typing import Any

import torch

from slime.train_batch.flags import TrainBatchConfig
from slime.train_batch.schedule import DPSchedule, ScheduleError, schedule_from_flags

logger = logging.getLogger(__name__)

WHOLE_ROLLOUT_KEYS = ("raw_reward", "total_lengths")
TENSOR_DTYPES: dict[str, torch.dtype | None] = {
    "tokens": torch.int64,
    "loss_masks": torch.int32,
    "rollout_log_probs": torch.float32,
    "teacher_log_probs": torch.float32,
    "rollout_top_p_token_ids": torch.int32,
    "rollout_top_p_token_offsets": torch.int32,
    "rollout_routed_experts": None,
}
_TYPECODES = {torch.int64: "q", torch.int32: "i", torch.float32: "f"}  # array typecodes of the same width
assert all(array.array(c).itemsize == d.itemsize for d, c in _TYPECODES.items())


def to_cpu_tensor(value: Any, dtype: torch.dtype | None) -> torch.Tensor:
    """A contiguous CPU tensor of `dtype` (None: keep the value's). Python lists go through `array`,
    which converts ints/floats three times faster than `torch.tensor(list)`."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", dtype or value.dtype).contiguous()
    if isinstance(value, list) and dtype in _TYPECODES:
        if not value:
            return torch.empty(0, dtype=dtype)
        try:
            return torch.frombuffer(array.array(_TYPECODES[dtype], value), dtype=dtype)
        except (TypeError, OverflowError):  # e.g. floats in an int list: let torch report or convert
            pass
    if hasattr(value, "flags") and not value.flags.writeable:  # read-only numpy array
        value = value.copy()
    tensor = torch.as_tensor(value, dtype=dtype) if dtype is not None else torch.as_tensor(value)
    return tensor.detach().cpu().contiguous()


def schedule_for(config: TrainBatchConfig, batch: dict, parallel_config: dict) -> DPSchedule:
    """The DP schedule of `batch` under `parallel_config` (slime's `{"dp_size", "cp_size", "vpp_size",
    "microbatch_group_size_per_vp_stage"}`) and the flags `--global-batch-size` (rollouts per step;
    unset = the whole rollout is one step), `--micro-batch-size` or
    `--use-dynamic-batch-size --max-tokens-per-gpu N`."""
    if not isinstance(parallel_config, dict) or "dp_size" not in parallel_config:
        raise ScheduleError(f"set_train_parallel_config needs a dict with 'dp_size', got {parallel_config!r}")
    dp_size = parallel_config["dp_size"]
    if isinstance(dp_size, bool) or not isinstance(dp_size, int) or dp_size < 1:
        raise ScheduleError(f"set_train_parallel_config: dp_size must be a positive integer, got {dp_size!r}")
    if "tokens" not in batch or not batch["tokens"]:
        raise ScheduleError("the training batch has no 'tokens' (no samples to schedule)")
    n = len(batch["tokens"])
    total_lengths = batch.get("total_lengths") or [len(t) for t in batch["tokens"]]
    rollout_ids = batch.get("rollout_ids") or list(range(n))  # no ids: every sample is its own rollout
    gbs = config.global_batch_size or len(set(rollout_ids))
    return schedule_from_flags(
        config, total_lengths, rollout_ids, global_batch_size=gbs, parallel_config=parallel_config
    )


def _mask_tensor(mask: Any) -> torch.Tensor:
    """Loss masks are mostly all ones (or all zeros for removed samples): `list.count` checks that at C
    speed, several times faster than converting every element."""
    if isinstance(mask, list) and mask:
        ones = mask.count(1)
        if ones == len(mask):
            return torch.ones(len(mask), dtype=torch.int32)
        if ones == 0 and mask.count(0) == len(mask):
            return torch.zeros(len(mask), dtype=torch.int32)
    return to_cpu_tensor(mask, torch.int32)


def _restrict(key: str, values: list, partition: list[int]) -> Any:
    picked = [values[i] for i in partition]
    if key == "loss_masks":
        return [_mask_tensor(v) for v in picked]
    if key in TENSOR_DTYPES:
        dtype = TENSOR_DTYPES[key]
        return [None if v is None else to_cpu_tensor(v, dtype) for v in picked]
    if key == "rollout_mask_sums":
        return torch.tensor(picked, dtype=torch.float32)
    if key == "multimodal_train_inputs":
        return [
            None if d is None else {k: to_cpu_tensor(v, None) if hasattr(v, "shape") else v for k, v in d.items()}
            for d in picked
        ]
    return picked


def split_for_data_parallel(config: TrainBatchConfig, batch: dict, parallel_config: dict) -> tuple[list[dict], dict]:
    """`batch` (from `convert_samples_to_train_data`) -> (one dict per DP rank, rollout metrics).

    Metrics: `rollout/train_steps`, `rollout/train_microbatches_per_rank`, `rollout/train_dp_token_spread`
    (worst step's (max - min) / max of the ranks' tokens), `rollout/train_dropped_rollouts` and
    `rollout/train_dropped_samples` (trailing rollouts that do not fill a `--global-batch-size` step;
    also logged as a warning)."""
    sched = schedule_for(config, batch, parallel_config)
    n = len(batch["tokens"])
    whole = {"total_lengths": batch.get("total_lengths") or [len(t) for t in batch["tokens"]]}
    if "raw_reward" in batch:
        whole["raw_reward"] = batch["raw_reward"]
    per_sample = [
        k for k, v in batch.items() if k not in WHOLE_ROLLOUT_KEYS and isinstance(v, (list, tuple)) and len(v) == n
    ]
    passthrough = {k: v for k, v in batch.items() if k not in WHOLE_ROLLOUT_KEYS and k not in per_sample}
    ranks = []
    for r, partition in enumerate(sched.partitions):
        data: dict[str, Any] = {"partition": partition}
        for key in per_sample:
            data[key] = _restrict(key, batch[key], partition)
        data.update(passthrough)
        data.update(whole)
        data["global_batch_sizes"] = list(sched.global_batch_sizes)
        data["num_microbatches"] = list(sched.num_microbatches)
        data["micro_batch_indices"] = sched.micro_batch_indices[r]
        ranks.append(data)
    if sched.dropped_samples:
        logger.warning(
            "--global-batch-size %s does not divide the rollout's %d rollouts: dropping the trailing "
            "%d rollouts (%d samples) from training",
            sched.global_batch_sizes[0],
            sched.dropped_rollouts + len(sched.global_batch_sizes) * sched.global_batch_sizes[0],
            sched.dropped_rollouts,
            len(sched.dropped_samples),
        )
    metrics = {
        "rollout/train_steps": len(sched.num_microbatches),
        "rollout/train_microbatches_per_rank": sum(sched.num_microbatches),
        "rollout/train_dp_token_spread": sched.rank_token_spread,
        "rollout/train_dropped_rollouts": sched.dropped_rollouts,
        "rollout/train_dropped_samples": len(sched.dropped_samples),
    }
    return ranks, metrics
