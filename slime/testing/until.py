"""`until` / `until_async`: poll a condition a test can observe but not wait on (another process's state:
/proc, an engine's /get_load, a server's counters), for the one place each that polls."""

from __future__ import annotations

import asyncio
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def until(pred: Callable[[], T], timeout: float = 30.0, interval: float = 0.01) -> T:
    """`pred()`'s first truthy value; after `timeout` seconds its last value (falsy), for the caller
    to assert with its own message: ``assert until(lambda: ...), "what did not happen"``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    return pred()


async def until_async(condition: Callable[[], object], interval: float = 0.005) -> None:
    """Until `condition()` holds, yielding to the loop's other tasks between checks; no deadline of its
    own: the caller bounds it (``await asyncio.wait_for(until_async(...), 10)``)."""
    while not condition():
        await asyncio.sleep(interval)
