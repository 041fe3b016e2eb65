"""`--rollout-external-engine-addrs`: engines someone else started (slime's flag), served through our router.

Each address (`host:port`, or a URL) must answer SGLang's `/health` before anything starts; the fleet then
registers them with the router it starts and starts no engine of its own. Nothing here supervises, restarts
or pushes weights to them: their owner does (`slime-train` refuses the flag for that reason).
"""

from __future__ import annotations

import requests

FLAG = "--rollout-external-engine-addrs"
HEALTH_TIMEOUT_S = 5.0  # seconds one engine may take to answer /health at start


class ExternalEngineError(ValueError):
    """An external engine address that cannot be used; the message names the flag and the address."""


def external_urls(addrs: list[str] | None) -> list[str]:
    """The engines' base URLs of the flag's addresses ([] when the flag is not given)."""
    addrs = addrs or []
    return [a.rstrip("/") if "://" in a else f"http://{a.rstrip('/')}" for a in addrs]


def check_reachable(urls: list[str], timeout: float = HEALTH_TIMEOUT_S) -> None:
    """Each engine answers `GET /health` with 200 within `timeout`, or ExternalEngineError naming it."""
    for url in urls:
        try:
            status = requests.get(f"{url}/health", timeout=timeout).status_code
        except requests.RequestException as e:
            raise ExternalEngineError(f"{FLAG}: no engine answers at {url} ({type(e).__name__}: {e})") from e
        if status != 200:
            raise ExternalEngineError(f"{FLAG}: {url}/health answered HTTP {status}; the engine is not ready")
