"""slime's `abort_servers_until_idle(urls)`: abort every request of each server, again while its load
still shows requests (an abort races requests that were being admitted), as slime's rollout does
before a weight update. Each server is asked `/abort_request {"abort_all": true}`, then its load
(`/v1/loads?include=core` as SGLang serves it, else `/get_load`, the embedded engine's); a server
whose load cannot be read is left after its abort, as in slime.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from slime.utils.http_utils import get, post

logger = logging.getLogger(__name__)

ABORT_RETRY_INTERVAL_SECONDS = 3
MAX_ABORT_ROUNDS = 100  # a server that never empties is given up on (slime retries forever)


def num_requests_from_load(load: Any) -> int:
    """Requests in an SGLang load answer (`loads` list, `num_reqs`/`num_total_reqs`/`total_reqs`, or
    running + waiting); 0 for anything else."""
    if isinstance(load, list):
        return sum(num_requests_from_load(item) for item in load)
    if not isinstance(load, dict):
        return 0
    if "loads" in load:
        return num_requests_from_load(load["loads"])
    for key in ("num_reqs", "num_total_reqs", "total_reqs"):
        if isinstance(load.get(key), int):
            return load[key]
    running = load.get("num_running_reqs", load.get("total_running_reqs"))
    waiting = load.get("num_waiting_reqs", load.get("total_waiting_reqs"))
    return (running if isinstance(running, int) else 0) + (waiting if isinstance(waiting, int) else 0)


async def _load(url: str) -> Any:
    try:
        return await get(f"{url}/v1/loads?include=core")
    except Exception:  # noqa: BLE001 - the embedded engine answers /get_load
        return await get(f"{url}/get_load")


async def abort_server_until_idle(url: str, retry_interval: float = ABORT_RETRY_INTERVAL_SECONDS) -> None:
    for attempt in range(1, MAX_ABORT_ROUNDS + 1):
        try:
            await post(f"{url}/abort_request", {"abort_all": True})
        except Exception as e:  # noqa: BLE001 - slime logs and goes on to read the load
            logger.warning("Failed to abort SGLang server at %s: %s", url, e)
        try:
            left = num_requests_from_load(await _load(url))
        except Exception as e:  # noqa: BLE001
            logger.warning("Failed to get SGLang server load from %s: %s", url, e)
            return
        if left <= 0:
            return
        logger.info(
            "SGLang server %s still has %d requests after abort attempt %d; retrying in %s s",
            url,
            left,
            attempt,
            retry_interval,
        )
        await asyncio.sleep(retry_interval)
    logger.warning("SGLang server %s still had requests after %d abort rounds", url, MAX_ABORT_ROUNDS)


async def abort_servers_until_idle(urls: list[str]) -> None:
    await asyncio.gather(*(abort_server_until_idle(url) for url in urls))
