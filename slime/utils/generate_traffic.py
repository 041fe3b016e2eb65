"""What counts as engine generation traffic, for the clients that feed the rollout's progress with it
(slime's `http_utils.post`, the runtime's `SlimeHttpClient`): a request to an engine's `/generate`, and
the tokens its answer carries."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit


def is_generate_url(url: str) -> bool:
    return urlsplit(url).path.rstrip("/").endswith("/generate")


def output_token_count(body: Any) -> int:
    """Tokens an SGLang `/generate` answer carries (0 for anything else; a list answers a batch)."""
    if isinstance(body, list):
        return sum(output_token_count(b) for b in body)
    if not isinstance(body, dict):
        return 0
    meta = body.get("meta_info") or {}
    for items in (meta.get("output_token_logprobs"), body.get("output_ids")):
        if isinstance(items, list):
            return len(items)
    n = meta.get("completion_tokens")
    return n if isinstance(n, int) else 0
