"""`Endpoints`: where rollout requests go, filled in by the fleet and read by the engine client.

One mutable object shared by both, so a restarted router or a replaced engine is seen by every
request that follows without anyone re-sending addresses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from slime.utils.router_loss import RouterLosses


class EngineOutage:
    """When the pool last lost its last engine or got one back (`since`, monotonic seconds; None before
    either happened), and whether it has none now (`empty`). A failing request's retry window counts
    from then, not from its first attempt (slime.utils.http_retry): a request that waited long on a
    loaded engine before that engine's node was lost still has the whole window for the replacement,
    and again once one serves, to get through the queue of retries; a refusal while no engine exists
    does not spend its count of retries either. Bounded: each window counts from a fault or a return
    of the pool, and the fleet's restart budget bounds those."""

    def __init__(self) -> None:
        self.empty = False
        self.since: float | None = None

    def published(self, engines: int) -> None:
        """The fleet published `engines` serving engines."""
        empty = engines == 0
        if empty != self.empty:
            self.empty, self.since = empty, time.monotonic()


@dataclass
class Endpoints:
    router_url: str | None = None
    engine_urls: list[str] = field(default_factory=list)  # for calls the router does not proxy (abort)
    # routers known gone: requests in flight on one are cut at once and retried at `router_url`
    router_losses: RouterLosses = field(default_factory=RouterLosses, repr=False, compare=False)
    # when the pool last emptied or came back: where a failing request's retry window starts
    outage: EngineOutage = field(default_factory=EngineOutage, repr=False, compare=False)


def rollout_num_engines(args: Any) -> int:
    """Engines behind the router: `--rollout-num-engines`, else GPUs / GPUs per engine (slime's rule)."""
    if args.rollout_num_engines is not None:
        return int(args.rollout_num_engines)
    gpus = args.rollout_num_gpus or 0
    return max(1, gpus // (args.rollout_num_gpus_per_engine or 1)) if gpus > 0 else 0
