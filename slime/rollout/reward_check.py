"""Whether a sample's reward can train, checked where slime would first need a number.

Rewards are kept exactly as the reward function returned them (a dict, a teacher's whole answer,
...) until the batch is built: `--custom-reward-post-process-path` may turn anything into scalars.
Without that hook the default post-processing reads `Sample.get_reward_value(args)` (`--reward-key`), so that value
must be a finite number; a sample whose value is not fails alone (FAILED, `reward_invalid`, the
message naming the flag that chose its reward function and the sample). With the hook, what the
hook returns must be numbers, else the batch fails naming the hook and the sample.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from slime.rollout.flags import RolloutConfig
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


def reward_source(config: RolloutConfig, sample: Sample) -> str:
    """The flag (or per-sample setting) that chose this sample's reward function."""
    if getattr(sample, "custom_rm_path", None):
        return f"Sample.custom_rm_path {sample.custom_rm_path!r}"
    if config.custom_rm_path:
        return f"--custom-rm-path {config.custom_rm_path!r}"
    meta = sample.metadata if isinstance(sample.metadata, dict) else {}
    if meta.get("rm_type"):
        return f"metadata['rm_type'] {meta['rm_type']!r}"
    return f"--rm-type {config.rm_type!r}"


def sample_name(sample: Sample) -> str:
    return f"sample {sample.index} (group {sample.group_index})"


def number_problem(value: Any) -> str | None:
    """Why `value` is not a finite number, or None when it is one."""
    if isinstance(value, (str, bytes, bool)) or not hasattr(value, "__float__"):
        return f"returned {value!r} ({type(value).__name__}), not a number"
    number = float(value)
    return None if math.isfinite(number) else f"returned {number}, not a finite number"


def reward_problem(config: RolloutConfig, sample: Sample) -> str | None:
    """Why the default post-processing cannot read a number from this sample's reward, or None."""
    reward, key = sample.reward, config.reward_key
    if key:
        if not isinstance(reward, dict) or key not in reward:
            return f"returned {reward!r}, which has no key {key!r} (--reward-key)"
        return number_problem(reward[key])
    if isinstance(reward, dict):
        return (
            f"returned a dict with keys {sorted(map(str, reward))}; pick one with --reward-key or turn it into "
            "numbers with --custom-reward-post-process-path"
        )
    return number_problem(reward)


def fail_invalid_rewards(config: RolloutConfig, samples: list[Sample]) -> int:
    """Mark FAILED every generated sample whose reward is not a usable number (returns how many).
    Its reward becomes 0.0: a FAILED sample trains nothing (dropped, or `remove_sample`)."""
    failed = 0
    for s in samples:
        if s.status in (Sample.Status.FAILED, Sample.Status.ABORTED):
            continue
        problem = reward_problem(config, s)
        if problem is None:
            continue
        error = f"{reward_source(config, s)} {problem} for {sample_name(s)}"
        s.status = Sample.Status.FAILED
        s.metadata["failure_reason"] = "reward_invalid"
        s.metadata["error"] = error
        s.reward = 0.0
        logger.warning("%s", error)
        failed += 1
    return failed
