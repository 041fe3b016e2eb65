"""The reward step of a generated group: every sample that needs a reward gets one.

Each sample alone (`async_rm`), or the whole group in one call with `--group-rm` (`batched_async_rm`).
Rewards are kept exactly as returned (numbers are checked when the batch is built, `reward_check`);
a reward function that raises fails its sample alone (FAILED, `reward_error`, flag and sample named).
The step reads its flags from the rollout's config; `args` only goes on to the reward functions (slime's
`async_rm(args, sample)`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from slime.rollout.failures import mark_failed
from slime.rollout.flags import RolloutConfig
from slime.rollout.reward_check import reward_source, sample_name
from slime.rollout.rm_hub import async_rm, batched_async_rm, inline_rule
from slime.utils.types import Sample

logger = logging.getLogger(__name__)
_deadline = getattr(asyncio, "timeout", None)  # Python >= 3.11


class RewardTimeout(TimeoutError):
    """A reward function that did not return within --reward-timeout."""


def _set_reward(config: RolloutConfig, sample: Sample, reward: Any) -> None:
    """Keep the reward exactly as returned (numbers are checked when the batch is built,
    `reward_check`); a reward function that raised or timed out fails this sample alone."""
    if isinstance(reward, RewardTimeout):
        error = f"{reward_source(config, sample)} on {sample_name(sample)}: {reward}"
        mark_failed(sample, "reward_timeout", error)
        logger.warning("%s", error)
        return
    if isinstance(reward, BaseException):
        error = f"{reward_source(config, sample)} raised on {sample_name(sample)}: {type(reward).__name__}: {reward}"
        mark_failed(sample, "reward_error", error)
        logger.warning("%s", error)
        return
    sample.reward = reward


async def _guarded(config: RolloutConfig, coro: Any) -> Any:
    """The coroutine's result, or the exception it raised (a reward bug costs one sample, not the rollout);
    one that does not return within --reward-timeout is a RewardTimeout (it hung the rollout before)."""
    timeout = config.reward_timeout
    try:
        if timeout is None:
            return await coro
        if _deadline is not None:  # the same deadline without a task of its own per reward (wait_for's)
            async with _deadline(timeout):
                return await coro
        return await asyncio.wait_for(coro, timeout)
    except asyncio.TimeoutError:
        return RewardTimeout(f"did not return within {timeout:g} s (--reward-timeout)")
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - handed to _set_reward, which names the flag and sample
        return e


def _scorable(samples: list[Sample]) -> list[Sample]:
    return [s for s in samples if s.status not in (Sample.Status.ABORTED, Sample.Status.FAILED)]


async def reward_each(config: RolloutConfig, args: Any, samples: list[Sample]) -> None:
    """Each sample's reward. A built-in rule computed in this thread (`inline_rule`) is called here, the same
    call `async_rm` would make, without a task and a deadline of its own per sample (a deadline cannot stop
    a call that never yields); any other reward runs concurrently under --reward-timeout."""
    todo = [s for s in _scorable(samples) if s.reward is None]  # a custom generate may have set it
    waiting = []
    for s in todo:
        call = inline_rule(args, s)
        if call is None:
            waiting.append(s)
            continue
        try:
            reward = call()
        except Exception as e:  # noqa: BLE001 - handed to _set_reward, which names the flag and sample
            reward = e
        _set_reward(config, s, reward)
    if waiting:
        for s, r in zip(waiting, await asyncio.gather(*(_guarded(config, async_rm(args, s)) for s in waiting))):
            _set_reward(config, s, r)


async def _reward_as_group(config: RolloutConfig, args: Any, samples: list[Sample]) -> None:
    """`--group-rm`: one call for the whole group; if it raises, each of its samples failed."""
    scorable = _scorable(samples)
    if not scorable:
        return
    rewards = await _guarded(config, batched_async_rm(args, scorable))
    if isinstance(rewards, BaseException):
        rewards = [rewards] * len(scorable)
    for s, r in zip(scorable, rewards):
        _set_reward(config, s, r)


def group_rm_applies(config: RolloutConfig, evaluation: bool) -> bool:
    return config.group_rm and not evaluation


async def reward_group(config: RolloutConfig, args: Any, samples: list[Sample], evaluation: bool) -> None:
    """Reward a generated group's samples (the whole group at once with `--group-rm`)."""
    step = _reward_as_group if group_rm_applies(config, evaluation) else reward_each
    await step(config, args, samples)
    for s in samples:
        if s.status == Sample.Status.FAILED:
            s.reward = 0.0  # never None or NaN in a batch; FAILED samples train nothing anyway
