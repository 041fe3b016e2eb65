"""Reward functions for tests/test_reward_timeout.py: one never returns for odd sample indices."""

from __future__ import annotations

import asyncio


async def hangs_on_odd(args, sample, **kwargs):
    if sample.index % 2:
        await asyncio.Event().wait()
    return 1.0


async def group_hangs(args, samples, **kwargs):
    await asyncio.Event().wait()
