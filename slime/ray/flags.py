"""What `slime.ray` reads of the namespace, once, as frozen configs (issue #33): the rollout manager's
(`ManagerConfig`: the fleet's, the metric log's and its own few flags) and the Ray session's (`SessionConfig`).

The namespace still enters here (`RolloutManager(args)`, `ray_init(args)`, `start_manager(args)`: slime's
trainer and our commands hand it over), and goes on only to slime's plugins (the controller), wandb (the run
records it) and back (`args.sglang_router_ip/port`, written where the router serves); nothing else in
`slime.ray` reads a flag off it. The fields have no defaults: the parser's are the only ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from slime.fleet.flags import FleetConfig
from slime.observability.flags import ReportConfig
from slime.utils.flag_config import ParsedConfig


@dataclass(frozen=True)
class ManagerConfig(ParsedConfig):
    """The rollout manager's: the fleet it starts, the metric log it writes, and its own few flags."""

    fleet: FleetConfig
    report: ReportConfig
    load_debug_rollout_data: str | None  # a replay: no fleet is started
    tool_config_path: str | None  # the tools whose shared services it owns
    rollout_batch_size: int  # prompts a rollout (`get_num_rollout_per_epoch`)
    load: str | None  # where the data source's state is restored from


@dataclass(frozen=True)
class SessionConfig(ParsedConfig):
    """The Ray session's: the cluster to join, and whether (and with which checkpoint) this node's engine fork
    server starts."""

    ray_address: str | None  # join this cluster; None: a private local Ray
    rollout_backend: str
    hf_checkpoint: str | None
    load_debug_rollout_data: str | None
    rollout_num_engines: int | None
    log_dir: str | None
