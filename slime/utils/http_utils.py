"""slime's HTTP helpers (`from slime.utils.http_utils import post`), for rollout modules written
for slime: a thin compatibility layer over the controller's engine client (its sessions, deadline,
retry counters). Unlike slime's, only transient failures (connection errors, timeouts, 429, 5xx)
are retried, each attempt has a deadline, and a 4xx fails at once with the body in the error.
Outside a controller (a plugin run by hand) each call opens its own session.
"""

from __future__ import annotations

from typing import Any

from slime.utils import http_retry

DEFAULT_TIMEOUT = 300.0


def _client() -> Any:
    """The bound rollout runtime's client, if this process has one. This module is a shim at slime's
    public path, so it reaches up to the rollout layer, lazily and read-only (it never creates one)."""
    from slime.rollout.runtime import bound

    rt = bound()
    return rt.client if rt is not None else None


async def post(url: str, payload: Any, max_retries: int = 60, headers: dict[str, str] | None = None, *,
               timeout: float | None = None) -> Any:
    policy = http_retry.RetryPolicy(max_retries=max_retries)
    client = _client()
    if client is not None:
        return await client.post(url, payload, timeout=timeout, policy=policy, headers=headers)
    return await http_retry.post(url, payload, timeout=timeout or DEFAULT_TIMEOUT, policy=policy, headers=headers)


async def get(url: str, max_retries: int = 5, timeout: float = 60.0) -> Any:
    client = _client()
    policy = http_retry.RetryPolicy(max_retries=max_retries)
    if client is not None:
        return await client.http.get(url, timeout=timeout, policy=policy, stats=client.stats)
    return await http_retry.get(url, timeout=timeout, policy=policy)


def get_rollout_num_engines(args: Any) -> int:
    """Engines behind the router (slime's helper)."""
    if getattr(args, "rollout_num_engines", None) is not None:
        return int(args.rollout_num_engines)
    gpus = getattr(args, "rollout_num_gpus", None) or 0
    return max(1, gpus // (getattr(args, "rollout_num_gpus_per_engine", None) or 1)) if gpus > 0 else 0


def init_http_client(args: Any) -> None:
    """slime sets up its global HTTP client here; ours lives in the controller's engine client, so
    there is nothing to do (kept so plugins that call it run unchanged)."""
    return None
