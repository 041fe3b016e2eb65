"""slime's `--rollout-function-path slime.rollout.sleep_rollout.sleep`: a rollout that never returns
(to keep engines and router up while debugging something else), logging once an hour that it waits."""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger(__name__)

HOUR_S = 3600.0


def sleep(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False, *, stop: threading.Event | None = None
) -> None:
    """Wait until `stop` is set (never, from the rollout manager); one log line per hour waited."""
    stop = stop or threading.Event()
    hours = 0
    while not stop.wait(HOUR_S):
        hours += 1
        logger.info("rollout sleep for %d hours", hours)
