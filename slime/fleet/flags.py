"""Flags of the fleet's self-healing: engine restarts, the request retry window, and the router's health-check
interval's default (the flag itself is defined with the router's in `slime.cli.args`).

The flags are `FleetConfig`'s fields; `add_fleet_arguments(parser)` (generated from them) is called by
`slime.cli.parser.build_parser` (`_optional_groups`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from slime.utils.flag_config import NON_NEGATIVE, FlagConfig, flag

DEFAULT_ENGINE_MAX_RESTARTS = 3
# seconds a failing engine request keeps being retried: a router restart (~1 s), an engine restart
# (model load), or a frozen engine the router marked unhealthy for a while
DEFAULT_REQUEST_RETRY_WINDOW = 60.0
# seconds between the router's health checks of each engine. A dead engine does not wait for them: the
# fleet's watcher blocks on each engine's process and Ray actor and takes it out of the router at once.
# They catch an engine that is alive but stuck (out after 2 misses + a 5 s timeout: ~65 s), at one GET per
# engine per interval in the router and the engines, rollout or not: 256 engines at 1 s cost the router
# 26 and the engines 70 CPU ms per second, at 30 s 0-1 and 5 (bench/bench_scale.py).
DEFAULT_ROUTER_HEALTH_CHECK_INTERVAL = 30


@dataclass(frozen=True)
class FleetConfig(FlagConfig):
    GROUP = "fleet faults"

    engine_max_restarts: int = flag(
        DEFAULT_ENGINE_MAX_RESTARTS,
        type=int,
        help="restarts of each engine whose server died; after that it is 'failed' and the pool goes on without it",
    )
    request_retry_window: float = flag(
        DEFAULT_REQUEST_RETRY_WINDOW,
        type=float,
        range=NON_NEGATIVE,
        help="seconds a request failing with a connection error, timeout, 429 or 5xx "
        "keeps being retried (back-off up to 2 s, fresh rid each time); "
        "--request-max-retries caps the count",
    )
    router_resource: str | None = flag(
        None,
        metavar="NAME",
        help="run the router on a node offering this Ray resource (ray start --resources "
        "'{\"NAME\": 1}'), listening on that node's IP; when that node is lost the router is "
        "started again on another node offering it, else on the manager's node, and requests in "
        "flight are retried there. Default: on the manager's node, its child, on 127.0.0.1",
    )


def add_fleet_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    return FleetConfig.add_arguments(parser)
