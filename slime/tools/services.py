"""`ToolServices`: long-lived services tools share, started by the RolloutManager and passed down.

Today that is the local sandbox's URL (for `sandbox_fusion_url: local`) and the names of the
cluster-wide rate limiters the manager created; the handles that stop them stay with the manager.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ToolServices:
    sandbox_url: str | None = None
    limiter_names: list[str] = field(default_factory=list)
