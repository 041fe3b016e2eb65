"""The fleet's flags as one frozen, typed config (`FleetConfig`), read once from the namespace by the fleet's owner
(the rollout manager) and handed down in parts: each engine actor gets an `EngineConfig`, the router a
`RouterConfig`'s options; nothing in `slime.fleet` reads `args`.

Its own flags (self-healing: engine restarts, the request retry window, the router's node) are `FleetFlags`'
fields; `add_fleet_arguments(parser)` (generated from them) is called by `slime.cli.parser.build_parser`
(`_optional_groups`). The rest are the core parser's ("model and engines", "router"), upstream slime's
(`--sglang-pp-size`, `--rollout-external-engine-addrs`), the `--sglang-*` passthrough and sglang-router's own
`--router-*` options: their defaults are the parser's only (these fields have none).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any

from slime.fleet.router_options import SLIME_SETS, router_passthrough
from slime.utils.flag_config import NON_NEGATIVE, FlagConfig, ParsedConfig, flag

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
class FleetFlags(FlagConfig):
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


@dataclass(frozen=True)
class EngineConfig(ParsedConfig):
    """How each engine server is started (what an engine actor receives)."""

    rollout_backend: str  # "hf" or "sglang" once finalized ("auto" resolved)
    hf_checkpoint: str | None
    engine_host: str
    log_dir: str | None
    engine_startup_timeout: float
    engine_max_batch_size: int
    engine_threads: int | None
    rollout_num_gpus_per_engine: int
    num_gpus_per_node: int
    offload: bool
    rollout_seed: int | None
    sglang_mem_fraction_static: float | None
    sglang_pp_size: int | None
    sglang_extra_args: dict[str, Any]  # the `--sglang-<name>` passthrough (`slime.cli.args.parse_args`)


@dataclass(frozen=True)
class RouterConfig(ParsedConfig):
    """The router the fleet starts (or, with `--sglang-router-ip/port`, the one it uses instead)."""

    sglang_router_ip: str | None
    sglang_router_port: int | None
    router_policy: str
    router_prometheus_port: int | None
    router_health_check_interval: int
    log_dir: str | None
    extra_args: tuple[str, ...]  # the `--router-*` options passed on (`router_options.router_passthrough`)

    @classmethod
    def from_args(cls, args: Any) -> RouterConfig:
        named = {f.name: getattr(args, f.name) for f in fields(cls) if f.name != "extra_args"}
        return cls(**named, extra_args=tuple(router_passthrough(args, taken=SLIME_SETS)))

    def router_kw(self) -> dict[str, Any]:
        """`Router`'s keywords (host and port aside)."""
        return {
            "policy": self.router_policy,
            "prometheus_port": self.router_prometheus_port,
            "health_check_interval": self.router_health_check_interval,
            "log_dir": self.log_dir,
            "extra_args": list(self.extra_args),
        }


@dataclass(frozen=True)
class FleetConfig(ParsedConfig):
    """Everything the fleet reads, once: its own flags, the engines', the router's, and the pool's size."""

    flags: FleetFlags
    engine: EngineConfig
    router: RouterConfig
    rollout_num_engines: int | None  # the embedded backend's engine count
    rollout_num_gpus: int | None  # SGLang's GPUs, packed `rollout_num_gpus_per_engine` an engine
    rollout_num_cpus_per_engine: float
    rollout_external_engine_addrs: list[str] | None  # engines someone else runs (external_engines)


def add_fleet_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    return FleetFlags.add_arguments(parser)
