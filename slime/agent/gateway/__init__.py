"""The agent gateway: OpenAI / Anthropic APIs in front of the engine pool, turning each agent session into
token-exact training Samples (protocols, sessions, rendering, the engine call, trajectories). It knows nothing of
sandboxes. `Gateway` and `GatewayConfig` (slime.agent.gateway.server) load on first use, so importing a part of
the gateway (its records, say) does not start FastAPI."""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {"Gateway": "slime.agent.gateway.server", "GatewayConfig": "slime.agent.gateway.server"}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'slime.agent.gateway' has no attribute {name!r}")
