"""`Endpoints`: where rollout requests go, filled in by the fleet and read by the engine client.

One mutable object shared by both, so a restarted router or a replaced engine is seen by every
request that follows without anyone re-sending addresses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slime.utils.router_loss import RouterLosses


@dataclass
class Endpoints:
    router_url: str | None = None
    engine_urls: list[str] = field(default_factory=list)  # for calls the router does not proxy (abort)
    # routers known gone: requests in flight on one are cut at once and retried at `router_url`
    router_losses: RouterLosses = field(default_factory=RouterLosses, repr=False, compare=False)


def rollout_num_engines(args: Any) -> int:
    """Engines behind the router: `--rollout-num-engines`, else GPUs / GPUs per engine (slime's rule)."""
    if getattr(args, "rollout_num_engines", None) is not None:
        return int(args.rollout_num_engines)
    gpus = getattr(args, "rollout_num_gpus", None) or 0
    return max(1, gpus // (getattr(args, "rollout_num_gpus_per_engine", None) or 1)) if gpus > 0 else 0
