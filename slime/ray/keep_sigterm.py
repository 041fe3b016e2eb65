"""`keep_sigterm_handler`: Ray's start leaves the command's SIGTERM handler in place.

`ray.init` installs SIGTERM handlers of its own: a Python one (exit 15; for a Ray it starts, also the
node's: kill Ray's processes, exit 1) and its core worker's native crash handler (abort with a stack
dump). A command that re-installed its handler after `ray.init` died that way of a SIGTERM landing
in between. Inside the block, Ray's installs are skipped and a SIGTERM is held until Ray has started
(seconds), then raised again for the handler that was there before: the orderly stop finds Ray whole.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator


def _skip_install(handler: Any) -> None:
    """Stands in for Ray's `set_sigterm_handler` inside the block: the command's handler stays."""


@contextlib.contextmanager
def keep_sigterm_handler() -> Iterator[None]:
    """Around `ray.init` (main thread only; elsewhere Ray installs no Python handler either)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    import ray._private.ray_constants as ray_constants
    import ray._private.utils as ray_utils

    held: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: held.append(signum))
    saved = ray_utils.set_sigterm_handler, ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
    ray_utils.set_sigterm_handler = _skip_install
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True  # this driver's core worker only
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler, ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = saved
        signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)  # None: not set from Python
        if held:
            signal.raise_signal(signal.SIGTERM)  # now: the handler from before runs (or the default action)
