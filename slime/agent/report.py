"""`log_rollout`: one line per agent rollout -- the mean reward and how many branches each sample had.

    --custom-rollout-log-function-path slime.agent.report.log_rollout

A sample's branches are the Samples its gateway session became (one per root-to-leaf chain; they
share the sample's `session_id`). Returns False, so the run's own rollout logging still happens.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from slime.utils.types import Sample


def summarize(samples: list[Sample]) -> dict[str, Any]:
    """Mean reward over the numeric rewards, branches per sample (by session), failures by reason."""
    rewards = [float(s.reward) for s in samples if isinstance(s.reward, (int, float))]
    branches = Counter(s.session_id or f"index={s.index}" for s in samples)
    failures = Counter(s.metadata.get("failure_reason") for s in samples if s.status == Sample.Status.FAILED)
    return {
        "samples": len(branches),
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "solved": sum(r == 1.0 for r in rewards),
        "branches_per_sample": sorted(branches.values()),
        "failed": dict(failures),
    }


def format_line(rollout_id: int, summary: dict[str, Any]) -> str:
    mean = "n/a" if summary["reward_mean"] is None else f"{summary['reward_mean']:.3f}"
    line = (
        f"agent rollout {rollout_id}: reward mean {mean} ({summary['solved']} solved) over "
        f"{summary['samples']} samples; branches per sample {summary['branches_per_sample']}"
    )
    return line + (f"; failed {summary['failed']}" if summary["failed"] else "")


def log_rollout(rollout_id: int, args: Any, samples: list[Sample], metrics: dict[str, Any], seconds: float) -> bool:
    print(format_line(rollout_id, summarize(samples)), flush=True)
    return False
