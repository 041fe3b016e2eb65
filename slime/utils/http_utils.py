"""slime-compatible HTTP helpers (`from slime.utils.http_utils import post`), for rollout
modules written for slime. Unlike slime's, every call has a deadline and only transient
failures (connection errors, 429, 5xx) are retried."""

from __future__ import annotations

from typing import Any

from slime.utils import http_retry as http


async def post(url: str, payload: Any, max_retries: int = 5, timeout: float = 300.0) -> Any:
    return await http.post(url, payload, timeout=timeout, policy=http.RetryPolicy(max_retries=max_retries))


async def get(url: str, max_retries: int = 5, timeout: float = 60.0) -> Any:
    return await http.get(url, timeout=timeout, policy=http.RetryPolicy(max_retries=max_retries))
