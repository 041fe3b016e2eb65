"""--tool-reward-mode add: the sample's reward is its outcome reward plus what its tools earned."""

from __future__ import annotations

from typing import Any

from rollout_plugins.multi_turn.context import MultiTurnContext
from slime.utils.trajectory import TrajectoryRecord
from slime.utils.types import Sample
from slime.utils.plugin_args import completed


async def add_tool_reward(args: Any, sample: Sample) -> None:
    """--tool-reward-mode add: reward = outcome reward (RM) + step rewards + final tool rewards."""
    args = completed(args)
    if args.tool_reward_mode != "add" or sample.status in (Sample.Status.ABORTED, Sample.Status.FAILED):
        return
    if args.group_rm:
        MultiTurnContext.get(args).warn_once(
            "group_rm",
            "--tool-reward-mode add is ignored with --group-rm; tool rewards are in metadata['tool_reward_total']",
        )
        return
    from slime.rollout.rm_hub import async_rm

    if not (args.custom_rm_path or args.rm_type):
        MultiTurnContext.get(args).warn_once(
            "no_rm",
            "--tool-reward-mode add without --rm-type/--custom-rm-path: "
            "the outcome reward is 0 and the reward is the tool reward",
        )
        outcome: Any = 0.0
    else:
        outcome = await async_rm(args, sample)
    record = TrajectoryRecord.of(sample)
    extra = record.tool_reward_total
    record.outcome_reward = outcome
    record.store(sample)
    if isinstance(outcome, dict):
        key = args.reward_key
        if key is None:
            raise ValueError(
                "--tool-reward-mode add: the reward function returned a dict; --reward-key must say "
                f"which of its entries ({', '.join(map(str, outcome))}) the tool rewards add to"
            )
        sample.reward = {**outcome, key: float(outcome[key]) + extra}
    else:
        sample.reward = float(outcome) + extra
