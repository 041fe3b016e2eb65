"""Reward functions for tests/test_reward_timeout.py: one never returns for odd sample indices."""

from __future__ import annotations

import asyncio


async def hangs_on_odd(args, sample, **kwargs):
    if sample.index % 2:
        await asyncio.Event().wait()
    return 1.0


async def group_hangs(args, samples, **kwargs):
    await asyncio.Event().wait()


async def generate_hangs_on_odd(args, sample, sampling_params):
    """A custom generate function that never returns for odd sample indices."""
    if sample.index % 2:
        await asyncio.Event().wait()
    sample.tokens, sample.response, sample.response_length = [1, 2, 3], "r", 1
    sample.loss_mask, sample.rollout_log_probs = [1], [-0.5]
    sample.status = sample.Status.COMPLETED
    return sample
