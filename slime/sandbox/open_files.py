"""The server's open files: its soft limit raised to the hard one at start, and the share of them
sessions' egress may hold.

Why: with the common soft limit of 1024, a few sessions within their own egress caps (each egress
connection holds two descriptors: the run's end and the target's) exhausted the server ("Too many
open files" on egress connects, and then on anything else). The soft limit is only a default; the
hard one is what the server may have, so it takes it. Then what the server needs for itself (one
HTTP connection per ``--max-connections``, a few per slot, a base) is set aside, and a session whose
egress cap does not fit in the rest is refused when it opens (`sessions.SessionTable.open`)."""

from __future__ import annotations

import resource

FDS_PER_SLOT = 16  # a slot's sockets, pidfds and pipes in the server, with room
FDS_BASE = 256  # the server's own: listening socket, logs, imports, threads' pipes
FDS_PER_EGRESS_CONNECTION = 2


def raise_soft_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard one (capped by the kernel's ``nr_open``); the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    try:
        with open("/proc/sys/fs/nr_open") as f:
            nr_open = int(f.read())
        target = nr_open if hard == resource.RLIM_INFINITY else min(hard, nr_open)
    except (OSError, ValueError):
        if hard == resource.RLIM_INFINITY:
            target = max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def egress_connection_budget(limit: int, max_connections: int, slots: int) -> int:
    """Egress connections all sessions together may hold, with `limit` descriptors for the server."""
    return max(0, (limit - max_connections - FDS_PER_SLOT * slots - FDS_BASE) // FDS_PER_EGRESS_CONNECTION)
