"""Cluster-wide rate limiter: an exact concurrency cap across processes and nodes, FIFO order, a token
rate (rate_per_second, burst) and AIMD on 429s, with no Ray round trip per call in the common case
(how: rate_limit/core.py). The RolloutManager creates one named actor per resource and keeps its handle;
workers use `client_for(name)`; `local_rate_limiter` is the same client and core without Ray."""

from __future__ import annotations

import asyncio
from typing import Any

from slime.tools.rate_limit.client import Permit, RateLimiter
from slime.tools.rate_limit.core import LimiterCore, RateLimiterConfigError, RateLimiterUnavailable, RateLimitTimeout

__all__ = ["LimiterCore", "Permit", "RateLimiter", "RateLimiterConfigError", "RateLimiterUnavailable",
           "RateLimitTimeout", "client_for", "get_or_create_rate_limiter", "get_rate_limiter", "kill_rate_limiter",
           "local_rate_limiter"]

ACTOR_PREFIX, DEFAULT_NAMESPACE = "slime_rate_limiter::", "slime"

# The one piece of module state: this process's clients of global limiters, keyed by (namespace,
# limiter name), one per event loop; a client whose loop has closed is abandoned (permits given back).
_clients: dict[tuple[str, str], list[RateLimiter]] = {}


def local_rate_limiter(max_concurrency: int, rate_per_second: float | None = None, burst: int | None = None,
                       name: str = "local", **options: Any) -> RateLimiter:
    """A limiter for this event loop only (no Ray), with the same API and semantics."""
    return RateLimiter(LimiterCore(name, max_concurrency, rate_per_second, burst, **options), name)


def get_or_create_rate_limiter(name: str, max_concurrency: int, rate_per_second: float | None = None,
                               burst: int | None = None, *, detached: bool = False,
                               namespace: str = DEFAULT_NAMESPACE, **options: Any):
    """The limiter actor for resource `name`, created if missing; keep the handle (a non-detached actor
    lives while a handle does; `detached=True`: until `kill_rate_limiter`). Other limits than the
    existing actor's raise `RateLimiterConfigError`. `options`: min_concurrency, lease_ttl, cut_cooldown."""
    import ray

    from slime.tools.rate_limit.actor import RateLimiterActor

    want = LimiterCore(name, max_concurrency, rate_per_second, burst, **options).config()
    opts: dict[str, Any] = {"name": ACTOR_PREFIX + name, "namespace": namespace, "get_if_exists": True,
                            "max_concurrency": 100_000}  # one long poll per client
    if detached:
        opts["lifetime"] = "detached"
    handle = RateLimiterActor.options(**opts).remote(name, max_concurrency, rate_per_second, burst, **options)
    if (have := ray.get(handle.config.remote())) != want:
        raise RateLimiterConfigError(f"rate limiter {name!r} already exists with {have}, asked for {want}; "
                                     "give each tool or service its own name, or use the same limits")
    return handle


def get_rate_limiter(name: str, namespace: str = DEFAULT_NAMESPACE):
    """The existing limiter actor for `name`, or None (never creates one)."""
    import ray

    try:
        return ray.get_actor(ACTOR_PREFIX + name, namespace=namespace)
    except ValueError:
        return None


def kill_rate_limiter(name: str, namespace: str = DEFAULT_NAMESPACE) -> bool:
    """Kill the limiter actor (its clients then raise `RateLimiterUnavailable`); False if there was none."""
    import ray

    _clients.pop((namespace, name), None)
    if (handle := get_rate_limiter(name, namespace)) is None:
        return False
    ray.kill(handle, no_restart=True)
    return True


def client_for(name: str, handle=None, namespace: str = DEFAULT_NAMESPACE) -> RateLimiter:
    """This event loop's client of the global limiter `name`. Without `handle` the actor is looked up
    by name and must exist (else `RateLimiterUnavailable`)."""
    from slime.tools.rate_limit.actor import ActorBackend

    loop = asyncio.get_running_loop()
    mine = _clients.setdefault((namespace, name), [])
    for c in list(mine):
        if c.loop is loop and c.broken is None and not c.closed:
            return c
        if c.loop is loop or c.loop.is_closed() or c.closed:
            c.abandon()  # e.g. one asyncio.run() per step: the dead loop's permits go back now
            mine.remove(c)
    if handle is None and (handle := get_rate_limiter(name, namespace)) is None:
        raise RateLimiterUnavailable(f"no rate limiter named {name!r}: the manager creates it with "
                                     "get_or_create_rate_limiter()")
    c = RateLimiter(ActorBackend(handle), name)
    c.loop = loop
    mine.append(c)
    return c
