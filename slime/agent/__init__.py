"""Agentic RL: agents speaking the OpenAI or Anthropic API train through a token-exact gateway.

The public names load on first use, so importing `slime.agent.flags` (the CLI does) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "Gateway": "slime.agent.gateway.server",
    "GatewayConfig": "slime.agent.gateway.server",
    "TrajectoryManager": "slime.agent.gateway.trajectory",
    "TurnRecord": "slime.agent.gateway.records",
    "AnthropicAdapter": "slime.agent.adapters",
    "OpenAIAdapter": "slime.agent.adapters",
    "BaseHarness": "slime.agent.sandboxes.harness",
    "HarnessContext": "slime.agent.sandboxes.harness",
    "Sandbox": "slime.agent.sandboxes.sandbox",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'slime.agent' has no attribute {name!r}")
