"""The flag groups of `build_parser`: ours by subject, then the packages' own (tools, agent,
observability, fleet, trainer), sglang-router's `--router-*`, and upstream slime's and Megatron-LM's
(`upstream_flags.py`). Named as in slime so run scripts move between the two."""

from __future__ import annotations

import argparse
import json

from slime.cli.upstream_flags import Alias, add_upstream_flags
from slime.fleet.flags import DEFAULT_ROUTER_HEALTH_CHECK_INTERVAL
from slime.fleet.router_options import router_option_actions, router_policies
from slime.rollout.defaults import REQUEST_MAX_RETRIES, ROLLOUT_BATCH_SIZE


class SlimeArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser that remembers which upstream attributes mirror ours (see upstream_flags)."""

    aliases: list[Alias]


def build_parser(prog: str = "slime-rollout") -> SlimeArgumentParser:
    p = SlimeArgumentParser(prog=prog, description="slime rollout service", allow_abbrev=False,
                            usage="%(prog)s [--flag VALUE ...]  (slime's and Megatron-LM's flags; see --help)",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("model and engines")
    g.add_argument("--hf-checkpoint", default=None,
                   help="local HF model dir; default: SmolLM2-135M-Instruct converted into $SLIME_CACHE")
    g.add_argument("--rollout-backend", choices=["auto", "hf", "sglang"], default="auto",
                   help="hf = embedded CPU engine; sglang = SGLang servers; auto = sglang when CUDA is present")
    g.add_argument("--rollout-num-engines", type=int, default=None, help="engines (CPU backend); default 1")
    g.add_argument("--rollout-num-gpus", type=int, default=None)
    g.add_argument("--rollout-num-gpus-per-engine", type=int, default=1)
    g.add_argument("--num-gpus-per-node", type=int, default=8)
    g.add_argument("--rollout-num-cpus-per-engine", type=float, default=1.0,
                   help="CPU share of each embedded engine's placement-group bundle (fractions allowed)")
    g.add_argument("--engine-threads", type=int, default=None, help="torch threads per embedded engine")
    g.add_argument("--engine-host", default="127.0.0.1", help="address engines bind; 'auto' = the node's IP")
    g.add_argument("--engine-startup-timeout", type=float, default=300.0)
    g.add_argument("--engine-max-batch-size", type=int, default=32)
    g.add_argument("--offload", action="store_true", help="start engines able to release memory (memory saver)")
    g.add_argument("--sglang-mem-fraction-static", type=float, default=None)

    g = p.add_argument_group("router")
    g.add_argument("--sglang-router-ip", default=None, help="use an existing router instead of starting one")
    g.add_argument("--sglang-router-port", type=int, default=None)
    g.add_argument("--router-policy", default="round_robin",
                   choices=router_policies() or ["round_robin", "cache_aware", "power_of_two", "random", "manual"],
                   help="sglang-router's load-balancing policy (the choices are the installed router's)")
    g.add_argument("--router-health-check-interval", type=int, default=DEFAULT_ROUTER_HEALTH_CHECK_INTERVAL,
                   help="seconds between the router's health checks of each engine (a dead engine is taken out "
                        "at once by the fleet's own supervision; this catches a stuck one)")
    g.add_argument("--router-prometheus-port", type=int, default=None, help="default: a free port")

    g = p.add_argument_group("data")
    g.add_argument("--prompt-data", default=None, help="JSONL or parquet prompts")
    g.add_argument("--input-key", default="input", help="dotted paths allowed, e.g. extra_info.question")
    g.add_argument("--label-key", default=None)
    g.add_argument("--metadata-key", default="metadata")
    g.add_argument("--tool-key", default="tools",
                   help="per-sample tools: a list of tool schemas (given to the chat template, metadata['tools']) "
                        "or verl's tools_kwargs mapping (metadata['tools_kwargs'])")
    g.add_argument("--apply-chat-template", action="store_true")
    g.add_argument("--multimodal-keys", type=json.loads, default=None,
                   help="slime's JSON {type: row key}, e.g. '{\"image\": \"images\"}': each row's images (paths, "
                        "data URIs, base64; no URLs) go into its prompt where its text says `<image>` (else "
                        "before the text), checked at preflight, and to a vision-language engine as image_data")
    g.add_argument("--rollout-shuffle", action="store_true")
    g.add_argument("--rollout-seed", type=int, default=42)
    g.add_argument("--rollout-max-prompt-len", type=int, default=None)
    g.add_argument("--over-long-prompt", choices=["filter", "error"], default="filter",
                   help="prompts longer than --rollout-max-context-len (or --rollout-max-prompt-len)")

    g = p.add_argument_group("rollout")
    g.add_argument("--num-rollout", type=int, default=None,
                   help="rollouts to run; default: from --num-epoch, else 1")
    g.add_argument("--start-rollout-id", type=int, default=None, help="default 0")
    g.add_argument("--rollout-batch-size", type=int, default=ROLLOUT_BATCH_SIZE,
                   help="prompts (groups) per rollout (required by slime; 4 here)")
    g.add_argument("--n-samples-per-prompt", type=int, default=1)
    g.add_argument("--over-sampling-batch-size", type=int, default=None,
                   help="groups started per sampling step (>= --rollout-batch-size; default equal): the extra "
                        "groups over-provision, the rollout stops once its target is met and aborts the rest")
    g.add_argument("--global-batch-size", type=int, default=None)
    g.add_argument("--rollout-max-response-len", type=int, default=64,
                   help="slime's default is None (up to the context length); the embedded engine needs a bound")
    g.add_argument("--rollout-max-context-len", type=int, default=None)
    g.add_argument("--rollout-temperature", type=float, default=1.0)
    g.add_argument("--rollout-top-p", type=float, default=1.0)
    g.add_argument("--rollout-top-k", type=int, default=-1)
    g.add_argument("--rollout-stop", nargs="+", default=None)
    g.add_argument("--rollout-stop-token-ids", type=int, nargs="+", default=None)
    g.add_argument("--rollout-skip-special-tokens", action="store_true")
    g.add_argument("--sglang-server-concurrency", type=int, default=512, help="in-flight requests per process")
    g.add_argument("--request-timeout", type=float, default=300.0, help="deadline of one engine request, seconds")
    g.add_argument("--request-max-retries", type=int, default=REQUEST_MAX_RETRIES,
                   help="cap on the retries of one request (connection errors, timeouts, 429, 5xx); the budget "
                        "is --request-retry-window seconds")
    g.add_argument("--dynamic-sampling-filter-path", default=None)
    g.add_argument("--partial-rollout", action="store_true",
                   help="aborted samples keep their partial response and are continued by a later rollout")
    g.add_argument("--mask-offpolicy-in-partial-rollout", action="store_true",
                   help="with --partial-rollout: loss mask 0 on tokens sampled by another weight version than "
                        "the one that finished the sample")
    g.add_argument("--abort-timeout", type=float, default=5.0,
                   help="seconds a rollout waits for the engines' answers to its abort before cancelling the "
                        "groups still running (returned to the buffer as they were handed out)")
    g.add_argument("--max-staleness", type=int, default=None,
                   help="fully-async rollout: samples whose oldest segment is more than this many weight versions "
                        "behind are dropped (continued with --partial-rollout); default: no bound")
    g.add_argument("--rollout-function-path", default="slime.rollout.sglang_rollout.generate_rollout")
    g.add_argument("--eval-function-path", default=None, help="default: --rollout-function-path")
    g.add_argument("--custom-generate-function-path", default=None)
    g.add_argument("--custom-generate-timeout", type=float, default=3600.0,
                   help="seconds a custom generate function may take on one sample; one that does not return fails "
                        "its sample (generate_timeout) and the rollout goes on")

    g = p.add_argument_group("reward")
    g.add_argument("--rm-type", default=None, help="a rule of slime.rollout.rm_hub (math, deepscaler, dapo, f1, "
                                                     "gpqa, ifbench, remote_rm, random, boxed_<type>, ...)")
    g.add_argument("--custom-rm-path", default=None)
    g.add_argument("--group-rm", action="store_true")
    g.add_argument("--reward-key", default=None, help="key of dict rewards used for training")
    g.add_argument("--reward-timeout", type=float, default=1800.0,
                   help="seconds one reward call (a sample's, or a group's with --group-rm) may take; one that does "
                        "not return fails its samples (reward_timeout) and the rollout goes on")

    g = p.add_argument_group("eval")
    g.add_argument("--eval-prompt-data", nargs="+", default=None, metavar="NAME PATH",
                   help="NAME PATH pairs; PATH may end in a row slice, e.g. aime /data/aime.jsonl@[0:30]")
    g.add_argument("--eval-interval", type=int, default=None)
    g.add_argument("--n-samples-per-eval-prompt", type=int, default=1)
    g.add_argument("--eval-max-response-len", type=int, default=None)
    g.add_argument("--eval-temperature", type=float, default=None)
    g.add_argument("--eval-top-p", type=float, default=None)
    g.add_argument("--eval-input-key", default=None)
    g.add_argument("--eval-label-key", default=None)
    g.add_argument("--skip-eval-before-train", action="store_true")

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
    from slime.fleet.flags import FleetConfig
    from slime.observability.flags import ObservabilityConfig
    from slime.tools.flags import ToolConfig
    from slime.train.flags import TrainConfig

    return ToolConfig, AgentConfig, ObservabilityConfig, FleetConfig, TrainConfig


def _optional_groups(p: argparse.ArgumentParser) -> None:
    """Flags owned by the tool, agent, observability, fleet and reference-trainer packages (their configs)."""
    for config in flag_configs():
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
