"""The flag groups of `build_parser`: ours by subject (the rollout's generated from `RolloutConfig`), then
the packages' own (tools, agent, observability, fleet, trainer), sglang-router's `--router-*`, and upstream
slime's and Megatron-LM's (`upstream_flags.py`). Named as in slime so run scripts move between the two."""

from __future__ import annotations

import argparse

from slime.cli.upstream_flags import Alias, add_upstream_flags
from slime.fleet.flags import DEFAULT_ROUTER_HEALTH_CHECK_INTERVAL
from slime.fleet.router_options import router_option_actions, router_policies
from slime.rollout.flags import RolloutConfig


class SlimeArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser that remembers which upstream attributes mirror ours (see upstream_flags)."""

    aliases: list[Alias]


def build_parser(prog: str = "slime-rollout") -> SlimeArgumentParser:
    p = SlimeArgumentParser(
        prog=prog,
        description="slime rollout service",
        allow_abbrev=False,
        usage="%(prog)s [--flag VALUE ...]  (slime's and Megatron-LM's flags; see --help)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("model and engines")
    g.add_argument(
        "--hf-checkpoint",
        default=None,
        help="local HF model dir; default: SmolLM2-135M-Instruct converted into $SLIME_CACHE",
    )
    g.add_argument(
        "--rollout-backend",
        choices=["auto", "hf", "sglang"],
        default="auto",
        help="hf = embedded CPU engine; sglang = SGLang servers; auto = sglang when CUDA is present",
    )
    g.add_argument("--rollout-num-engines", type=int, default=None, help="engines (CPU backend); default 1")
    g.add_argument("--rollout-num-gpus", type=int, default=None)
    g.add_argument("--rollout-num-gpus-per-engine", type=int, default=1)
    g.add_argument("--num-gpus-per-node", type=int, default=8)
    g.add_argument(
        "--rollout-num-cpus-per-engine",
        type=float,
        default=1.0,
        help="CPU share of each embedded engine's placement-group bundle (fractions allowed)",
    )
    g.add_argument("--engine-threads", type=int, default=None, help="torch threads per embedded engine")
    g.add_argument("--engine-host", default="127.0.0.1", help="address engines bind; 'auto' = the node's IP")
    g.add_argument("--engine-startup-timeout", type=float, default=300.0)
    g.add_argument("--engine-max-batch-size", type=int, default=32)
    g.add_argument("--offload", action="store_true", help="start engines able to release memory (memory saver)")
    g.add_argument("--sglang-mem-fraction-static", type=float, default=None)

    g = p.add_argument_group("router")
    g.add_argument("--sglang-router-ip", default=None, help="use an existing router instead of starting one")
    g.add_argument("--sglang-router-port", type=int, default=None)
    g.add_argument(
        "--router-policy",
        default="round_robin",
        choices=router_policies() or ["round_robin", "cache_aware", "power_of_two", "random", "manual"],
        help="sglang-router's load-balancing policy (the choices are the installed router's)",
    )
    g.add_argument(
        "--router-health-check-interval",
        type=int,
        default=DEFAULT_ROUTER_HEALTH_CHECK_INTERVAL,
        help="seconds between the router's health checks of each engine (a dead engine is taken out "
        "at once by the fleet's own supervision; this catches a stuck one)",
    )
    g.add_argument("--router-prometheus-port", type=int, default=None, help="default: a free port")

    RolloutConfig.add_arguments(p)  # data, rollout, reward, eval

    g = p.add_argument_group("debug")
    g.add_argument("--debug-rollout-only", action="store_true")
    g.add_argument("--save-debug-rollout-data", default=None, help="path with {rollout_id}")
    g.add_argument("--load-debug-rollout-data", default=None, help="path with {rollout_id}; starts no engines")
    g.add_argument("--save-debug-train-data", default=None, help="path with {rollout_id}")
    g.add_argument("--save", default=None, help="directory for the data source state (incl. buffer)")
    g.add_argument("--load", default=None, help="directory to resume the data source state from")
    g.add_argument("--ray-address", default=None, help="join this Ray cluster; default: start a local one")
    g.add_argument("--log-dir", default=None, help="engine and router logs; default: a temp dir")

    _optional_groups(p)
    _router_groups(p)
    p.aliases = add_upstream_flags(p)
    return p


def flag_configs() -> tuple[type, ...]:
    """The packages' typed flag configs (`slime.utils.flag_config`), in the order their groups are added."""
    from slime.agent.flags import AgentConfig
    from slime.fleet.flags import FleetFlags
    from slime.observability.flags import ObservabilityConfig
    from slime.tools.flags import ToolConfig
    from slime.train.flags import TrainConfig

    return RolloutConfig, ToolConfig, AgentConfig, ObservabilityConfig, FleetFlags, TrainConfig


def _optional_groups(p: argparse.ArgumentParser) -> None:
    """Flags owned by the tool, agent, observability, fleet and reference-trainer packages (their configs;
    the rollout's are added where its groups always stood, after the router's)."""
    for config in flag_configs():
        if config is not RolloutConfig:
            config.add_arguments(p)


def _router_groups(p: argparse.ArgumentParser) -> None:
    """sglang-router's own `--router-*` flags, as slime registers them (ours above take precedence)."""
    # the router package is optional for parsing: without it its flags stay unknown
    g = p.add_argument_group("sglang-router (passed to the router slime starts; see sglang_router.launch_router)")
    taken = p._option_string_actions  # noqa: SLF001
    for action in router_option_actions():
        if any(o in taken for o in action.option_strings):
            continue
        g._add_action(action)  # noqa: SLF001 - reuse the action exactly as sglang-router defines it
    # slime's overrides of the router defaults (sglang_utils/arguments.py)
    defaults = {"router_log_level": "warn", "router_balance_abs_threshold": 10, "router_balance_rel_threshold": 1.2}
    p.set_defaults(**{k: v for k, v in defaults.items() if any(a.dest == k for a in p._actions)})  # noqa: SLF001
