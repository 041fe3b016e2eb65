"""The router's `GET /workers` answer, checked before anything reads it.

sglang-router 0.3.x answers `{"workers": [{"id": "<uuid>", "url": "http://...", "is_healthy": true,
...}], "total": N, ...}`. The fleet registers and removes engines by what it says and the engine
client aborts on the workers it lists, so an answer of another shape (not JSON, an HTML page, a
worker without a usable `url`, an `id` or `is_healthy` of the wrong type) is refused whole, never
half-read: `parse_workers` raises `BadRouterAnswer` naming the router URL, the field and an excerpt,
and its reason (`router_bad_answer:<field>`) is what callers count.
"""

from __future__ import annotations

import json
import reprlib
from dataclasses import dataclass
from typing import Any

from slime.utils.http_retry import AnswerError

EXCERPT_CHARS = 200
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = EXCERPT_CHARS
_SHORT.maxlist = _SHORT.maxdict = 6


@dataclass(frozen=True)
class Worker:
    url: str
    id: str | None  # the handle of `DELETE /workers/{id}`; None when the router gives none
    healthy: bool  # True when the router does not say


class BadRouterAnswer(AnswerError):
    """A `/workers` answer that breaks the router's shape; `field` names the part that is wrong."""

    def __init__(self, router_url: str, field: str, problem: str, excerpt: Any):
        self.field = field
        shown = excerpt.decode("utf-8", "replace") if isinstance(excerpt, bytes) else excerpt
        text = shown if isinstance(shown, str) else _SHORT.repr(shown)
        text = text[:EXCERPT_CHARS] + ("..." if len(text) > EXCERPT_CHARS else "")
        super().__init__(
            f"bad router answer from {router_url}/workers ({field}): {problem}: {text}",
            reason=f"router_bad_answer:{field}",
        )


def parse_workers(raw: bytes | str | Any, router_url: str) -> list[Worker]:
    """The workers of a `/workers` answer (raw bytes, text, or already-decoded JSON); a list of
    worker objects is accepted as well as the 0.3.x object around it."""
    body = raw
    if isinstance(raw, (bytes, str)):
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise BadRouterAnswer(router_url, "body", "not JSON", raw) from None
    workers = body.get("workers") if isinstance(body, dict) else body
    if not isinstance(workers, list):
        raise BadRouterAnswer(router_url, "workers", "no list of workers", body)
    return [_worker(w, i, router_url) for i, w in enumerate(workers)]


def _worker(w: Any, i: int, router_url: str) -> Worker:
    if not isinstance(w, dict):
        raise BadRouterAnswer(router_url, "workers", f"item {i} is not an object", w)
    url, wid, healthy = w.get("url"), w.get("id"), w.get("is_healthy", True)
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise BadRouterAnswer(router_url, "url", f"item {i}: not an http(s) URL", w)
    if wid is not None and (not isinstance(wid, str) or not wid or "/" in wid):
        raise BadRouterAnswer(router_url, "id", f"item {i}: not a worker id", w)
    if not isinstance(healthy, bool):
        raise BadRouterAnswer(router_url, "is_healthy", f"item {i}: not a boolean", w)
    return Worker(url=url, id=wid, healthy=healthy)
