"""The core as a Ray named actor (one per limiter), and a client's line to it."""

from __future__ import annotations

import asyncio
from typing import Any

import ray

from slime.tools.rate_limit.core import LimiterCore

# An async actor (`poll` is async): Ray runs every method, sync ones too, on its one event loop.
RateLimiterActor = ray.remote(num_cpus=0, max_restarts=0)(LimiterCore)


class ActorBackend:
    """What a `RateLimiter` calls: `push` returns a future resolved once the actor applied it."""

    def __init__(self, handle) -> None:
        self.handle = handle

    def push(self, cid: str, msg: dict[str, Any]) -> asyncio.Future:
        return asyncio.wrap_future(self.handle.push.remote(cid, msg).future())

    def poll(self, cid: str):
        return self.handle.poll.remote(cid)

    def stats(self):
        return self.handle.stats.remote()
