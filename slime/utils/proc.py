"""Child processes that die with their parent (Linux `PR_SET_PDEATHSIG`).

Engines and routers run in their own session (so a signal to the group reaches all of their
workers); without this, a crashed or killed Ray actor would leave them running."""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass
