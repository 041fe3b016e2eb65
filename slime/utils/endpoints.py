"""`Endpoints`: where rollout requests go, filled in by the fleet and read by the engine client.

One mutable object shared by both, so a restarted router or a replaced engine is seen by every
request that follows without anyone re-sending addresses.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Endpoints:
    router_url: str | None = None
    engine_urls: list[str] = field(default_factory=list)  # for calls the router does not proxy (abort)
