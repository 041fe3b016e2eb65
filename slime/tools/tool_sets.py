"""`ToolSetCache`: the tool sets one owner loaded, by config file, built on first use and shared.

Tools hold shared resources (HTTP sessions, rate limiters), so every trajectory of a runtime uses
one set per `--tool-config-path`; the owner (the rollout runtime, `RolloutRuntime.tool_sets`)
closes them when it closes, on the loop their sessions were opened on.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from slime.tools.registry import ToolSet, load_tool_config


class ToolSetCache:
    def __init__(self) -> None:
        self._sets: dict[str, ToolSet] = {}  # key: the config file's absolute path
        self._lock = threading.Lock()  # rollout threads may load the same file at once

    def get(self, path: str | Path) -> ToolSet:
        """The tools of `path`: built on first use, then the same objects."""
        key = os.path.abspath(str(path))
        with self._lock:
            if key not in self._sets:
                self._sets[key] = load_tool_config(path)
            return self._sets[key]

    def clear(self) -> None:
        """Forget the sets without closing them."""
        with self._lock:
            self._sets.clear()

    async def close(self) -> None:
        """Close and forget every set (a tool's optional `close()`); a later `get` builds a fresh one."""
        with self._lock:
            tool_sets = list(self._sets.values())
            self._sets.clear()
        for tool_set in tool_sets:
            await tool_set.close()
