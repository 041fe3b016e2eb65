"""Command-line flags, named as in slime so run scripts move between the two.

`parse_args` returns an argparse Namespace (what plugins written for slime expect) after
`finalize_args` derived what upstream derives and `validate_args` checked it: every bad value is
reported with the flag that carries it. Besides the flags defined here (and by slime.tools /
slime.observability), every flag of upstream slime and Megatron-LM is accepted and stored with
upstream's default (`upstream_flags.py`), so a slime run script's whole argument list parses; a flag
nobody defines is an error naming it. Flags of the form `--sglang-<name> VALUE` that are not defined
are passed through to `sglang.launch_server --<name> VALUE` (and stored as `args.sglang_<name>`).
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
from pathlib import Path
from typing import Any, Sequence

from slime.utils.eval_config import EvalConfigError, resolve_eval_datasets
from slime.cli.honest_flags import unused_flags_line
from slime.cli.upstream_flags import Alias, add_upstream_flags, apply_aliases
from slime.fleet.flags import DEFAULT_ROUTER_HEALTH_CHECK_INTERVAL
from slime.rollout.data_source import parse_path_slice

logger = logging.getLogger(__name__)

OUR_SGLANG_FLAGS = {"sglang_router_ip", "sglang_router_port", "sglang_server_concurrency"}


class ArgError(ValueError):
    """A flag has a bad value; the message names the flag."""


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


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
                   choices=["round_robin", "cache_aware", "power_of_two", "random", "consistent_hashing"])
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
    g.add_argument("--rollout-shuffle", action="store_true")
    g.add_argument("--rollout-seed", type=int, default=42)
    g.add_argument("--rollout-max-prompt-len", type=int, default=None)
    g.add_argument("--over-long-prompt", choices=["filter", "error"], default="filter",
                   help="prompts longer than --rollout-max-context-len (or --rollout-max-prompt-len)")

    g = p.add_argument_group("rollout")
    g.add_argument("--num-rollout", type=int, default=None,
                   help="rollouts to run; default: from --num-epoch, else 1")
    g.add_argument("--start-rollout-id", type=int, default=None, help="default 0")
    g.add_argument("--rollout-batch-size", type=int, default=4,
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
    g.add_argument("--request-max-retries", type=int, default=100,
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

    g = p.add_argument_group("reward")
    g.add_argument("--rm-type", default=None, help="a rule of slime.rollout.rm_hub (math, deepscaler, dapo, f1, "
                                                     "gpqa, ifbench, remote_rm, random, boxed_<type>, ...)")
    g.add_argument("--custom-rm-path", default=None)
    g.add_argument("--group-rm", action="store_true")
    g.add_argument("--reward-key", default=None, help="key of dict rewards used for training")

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


def _optional_groups(p: argparse.ArgumentParser) -> None:
    """Flags owned by the tool, observability, fleet, reference-trainer and agent packages."""
    from slime.observability.flags import add_observability_arguments
    from slime.tools.flags import add_tool_arguments
    from slime.fleet.flags import add_fleet_arguments
    from slime.train.flags import add_train_arguments
    from slime.agent.flags import add_agent_arguments

    add_tool_arguments(p)
    add_agent_arguments(p)
    add_observability_arguments(p)
    add_fleet_arguments(p)
    add_train_arguments(p)


def _router_groups(p: argparse.ArgumentParser) -> None:
    """sglang-router's own `--router-*` flags, as slime registers them (ours above take precedence)."""
    try:
        from sglang_router.router_args import RouterArgs
    except ImportError:  # the router package is optional for parsing: its flags then stay unknown
        return
    scratch = argparse.ArgumentParser(add_help=False)
    RouterArgs.add_cli_args(scratch, use_router_prefix=True, exclude_host_port=True)
    g = p.add_argument_group("sglang-router (stored on args; see sglang_router.launch_router)")
    taken = p._option_string_actions  # noqa: SLF001
    for action in scratch._actions:  # noqa: SLF001
        if not action.option_strings or any(o in taken for o in action.option_strings):
            continue
        g._add_action(action)  # noqa: SLF001 - reuse the action exactly as sglang-router defines it
    # slime's overrides of the router defaults (sglang_utils/arguments.py)
    defaults = {"router_log_level": "warn", "router_balance_abs_threshold": 10, "router_balance_rel_threshold": 1.2}
    p.set_defaults(**{k: v for k, v in defaults.items() if any(a.dest == k for a in p._actions)})  # noqa: SLF001


def _coerce(value: Any) -> Any:
    """A passthrough value as sglang's parser would most likely type it (for args.sglang_<name>)."""
    if isinstance(value, list):
        return [_coerce(v) for v in value]
    if not isinstance(value, str):
        return value
    for conv in (int, float):
        try:
            return conv(value)
        except ValueError:
            pass
    return value


def _sglang_passthrough(unknown: Sequence[str], parser: argparse.ArgumentParser) -> dict[str, Any]:
    out: dict[str, Any] = {}
    i = 0
    while i < len(unknown):
        tok = unknown[i]
        if not tok.startswith("--sglang-"):
            parser.error(_unknown_message(tok, parser))
        name, eq, value = tok[len("--sglang-"):].partition("=")
        if not eq:
            values = []
            while i + 1 < len(unknown) and not unknown[i + 1].startswith("--"):
                values.append(unknown[i + 1])
                i += 1
            # a bare flag is a switch; several values are an nargs list (e.g. --sglang-cuda-graph-bs 1 2 4)
            value = True if not values else values[0] if len(values) == 1 else values
        out[name.replace("-", "_")] = value
        i += 1
    return out


def _unknown_message(token: str, parser: argparse.ArgumentParser) -> str:
    if not token.startswith("-"):
        return f"unrecognized argument: {token!r} (a value with no flag before it)"
    flag = token.partition("=")[0]
    close = difflib.get_close_matches(flag, list(parser._option_string_actions), n=3)  # noqa: SLF001
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return (f"unrecognized argument: {flag} (not a flag of slime, Megatron-LM or this service{hint}; "
            f"SGLang server flags are passed as --sglang-<name>)")


def parse_args(argv: Sequence[str] | None = None, prog: str = "slime-rollout") -> argparse.Namespace:
    parser = build_parser(prog)
    args, unknown = parser.parse_known_args(argv)
    args.sglang_extra_args = _sglang_passthrough(unknown, parser)
    for name, value in args.sglang_extra_args.items():
        setattr(args, f"sglang_{name}", _coerce(value))  # where slime plugins look for sglang settings
    line = unused_flags_line(parser, args)  # what the user set, before finalize derives anything
    apply_aliases(args, parser.aliases)
    finalize_args(args)
    if line:
        logger.warning("%s: %s", prog, line)
    return args


def apply_custom_config(args: argparse.Namespace) -> None:
    """`--custom-config-path FILE.yaml`: each top-level key is set on args (upstream: overrides, and new
    keys for custom functions)."""
    path = getattr(args, "custom_config_path", None)
    if not path:
        return
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ArgError(f"--custom-config-path: file not found: {path}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ArgError(f"--custom-config-path {path}: invalid YAML: {e}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ArgError(f"--custom-config-path {path}: the top level must be a mapping of argument names")
    for key, value in data.items():
        if hasattr(args, key):
            logger.info("--custom-config-path %s: %s = %r (was %r)", path, key, value, getattr(args, key))
        setattr(args, key, value)


def _fill_defaults(args: argparse.Namespace) -> None:
    if hasattr(args, "sglang_extra_args") and hasattr(args, "eps_clip"):
        return  # made by parse_args
    for action in build_parser()._actions:  # noqa: SLF001
        if action.dest not in ("help", argparse.SUPPRESS) and not hasattr(args, action.dest) \
                and action.default is not argparse.SUPPRESS:
            value = action.default
            if isinstance(value, str) and callable(action.type):  # as argparse converts string defaults
                value = action.type(value)
            setattr(args, action.dest, value)
    if not hasattr(args, "sglang_extra_args"):
        args.sglang_extra_args = {}


def _count_rows(path: str) -> int:
    """Rows of a prompt file (after its @[start:end] slice), for --num-epoch; counted, not read."""
    from slime.rollout.prompt_index import count_rows

    return count_rows(path)


def finalize_args(args: argparse.Namespace) -> argparse.Namespace:
    """Apply --custom-config-path, fill what upstream slime derives, then validate.

    A namespace built by hand (not by parse_args) gets every missing flag's default first.
    """
    _fill_defaults(args)
    apply_custom_config(args)
    if args.rollout_backend == "auto":
        args.rollout_backend = "sglang" if _cuda_available() else "hf"
    if args.rollout_num_gpus is None and args.colocate and args.rollout_backend == "sglang":
        args.rollout_num_gpus = args.actor_num_gpus_per_node * args.actor_num_nodes  # slime: the actors' GPUs
    if args.rollout_num_engines is None:
        if args.rollout_backend == "sglang" and args.rollout_num_gpus:
            args.rollout_num_engines = max(1, args.rollout_num_gpus // max(1, args.rollout_num_gpus_per_engine))
        else:
            args.rollout_num_engines = 1
    if args.rollout_num_gpus is None and args.rollout_backend != "sglang":
        # slime always has a number here and plugins size their pools by it (strands-sglang:
        # concurrency x rollout_num_gpus // rollout_num_gpus_per_engine): one slot per embedded engine
        args.rollout_num_gpus = args.rollout_num_engines * max(1, args.rollout_num_gpus_per_engine)
    if args.eval_function_path is None:
        args.eval_function_path = args.rollout_function_path
    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = args.rollout_batch_size
    if getattr(args, "num_steps_per_rollout", None):
        gbs = args.rollout_batch_size * args.n_samples_per_prompt // args.num_steps_per_rollout
        if args.global_batch_size is not None and args.global_batch_size != gbs:
            raise ArgError(f"--global-batch-size {args.global_batch_size} disagrees with --num-steps-per-rollout "
                           f"{args.num_steps_per_rollout} (rollout_batch_size * n_samples_per_prompt // steps = {gbs})")
        args.global_batch_size = gbs
    if args.global_batch_size is None:
        args.global_batch_size = args.rollout_batch_size * args.n_samples_per_prompt
    if args.eval_max_response_len is None:
        args.eval_max_response_len = args.rollout_max_response_len
    if args.start_rollout_id is None:
        args.start_rollout_id = 0
    if args.num_rollout is None:
        if getattr(args, "num_epoch", None) is not None and args.prompt_data and Path(
                parse_path_slice(args.prompt_data)[0]).is_file():
            # upstream: num_epoch * len(dataset) // rollout_batch_size (over-long prompts are not discounted here)
            args.num_rollout = args.num_epoch * _count_rows(args.prompt_data) // args.rollout_batch_size
        else:
            args.num_rollout = 1
    _finalize_upstream(args)
    try:
        args.eval_datasets = resolve_eval_datasets(args)
    except EvalConfigError as e:
        raise ArgError(str(e)) from None
    if args.eval_datasets:  # upstream rewrites it as the flat NAME PATH list
        args.eval_prompt_data = [x for d in args.eval_datasets for x in (d.name, d.path)]
    validate_args(args)
    return args


def _finalize_upstream(args: argparse.Namespace) -> None:
    """Upstream's derived values (slime_validate_args) that plugins and slime-train read."""
    if args.n_samples_per_prompt == 1:
        args.grpo_std_normalization = False
    # the names the controller's batch conversion reads
    args.disable_rewards_normalization = not args.rewards_normalization
    args.disable_grpo_std_normalization = not args.grpo_std_normalization
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    if args.eval_reward_key is None:
        args.eval_reward_key = args.reward_key
    if args.dump_details is not None:
        args.save_debug_rollout_data = f"{args.dump_details}/rollout_data/{{rollout_id}}.pt"
        args.save_debug_train_data = f"{args.dump_details}/train_data/{{rollout_id}}.pt"
    if args.use_dynamic_batch_size and args.log_probs_max_tokens_per_gpu is None:
        args.log_probs_max_tokens_per_gpu = args.max_tokens_per_gpu
    if args.balance_by_flops:
        args.balance_data = True
    if args.use_rollout_routing_replay:
        args.use_routing_replay = True
    args.rollout_external = args.rollout_external_engine_addrs is not None
    args.use_critic = args.advantage_estimator == "ppo"
    args.critic_num_gpus_per_node, args.critic_num_nodes = args.actor_num_gpus_per_node, args.actor_num_nodes
    # --offload = --offload-train + --offload-rollout; --colocate implies both (args.offload is kept: ours reads it)
    if args.offload:
        args.offload_train = args.offload_rollout = True
    if args.colocate:
        if args.offload_train is None:
            args.offload_train = True
        if args.offload_rollout is None:
            args.offload_rollout = True
    args.offload_train = bool(args.offload_train)
    args.offload_rollout = bool(args.offload_rollout)
    if args.offload_rollout:
        args.offload = True  # our engines read --offload for "able to release memory"
    if args.eval_max_context_len is None:
        args.eval_max_context_len = args.rollout_max_context_len
    if args.rollout_max_context_len is not None and args.rollout_max_prompt_len is None:
        args.rollout_max_prompt_len = args.rollout_max_context_len - 1


def _check_rm_type(args: argparse.Namespace) -> None:
    """Reject an unknown --rm-type (also an eval dataset's rm_type) at start-up, before any engine starts."""
    eval_types = [(d.name, d.rm_type) for d in args.eval_datasets if getattr(d, "rm_type", None)]
    if args.rm_type is None and not eval_types:
        return
    try:
        from slime.rollout import rm_hub
    except ModuleNotFoundError as e:  # until slime.rollout.rm_hub lands; then this branch is dead
        if e.name not in ("slime.rollout.rm_hub",):
            raise
        return
    check = getattr(rm_hub, "check_rm_type", None)
    if check is None:  # the package is being created
        return
    import inspect

    takes_args = "args" in inspect.signature(check).parameters  # remote_rm also needs --rm-url
    eval_flag = "--eval-config" if args.eval_config else "--eval-prompt-data"
    for where, rm_type in ([("", args.rm_type)] if args.rm_type else []) + eval_types:
        try:
            check(rm_type, args=args) if takes_args else check(rm_type)
        except (ValueError, KeyError) as e:
            msg = str(e) if str(e).startswith("--rm-type") else f"--rm-type: {e}"
            raise ArgError(f"{eval_flag}: dataset {where!r}: {msg}" if where else msg) from None


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def validate_args(args: argparse.Namespace) -> None:
    def need(cond: bool, flag: str, msg: str) -> None:
        if not cond:
            raise ArgError(f"{flag}: {msg}")

    for flag in ("rollout_batch_size", "n_samples_per_prompt", "rollout_max_response_len",
                 "sglang_server_concurrency", "n_samples_per_eval_prompt", "rollout_num_engines"):
        need(getattr(args, flag) >= 1, _flag(flag), f"must be >= 1, got {getattr(args, flag)}")
    need(args.num_rollout >= 0, "--num-rollout", "must be >= 0")
    need(args.start_rollout_id >= 0, "--start-rollout-id", "must be >= 0")
    need(args.over_sampling_batch_size >= args.rollout_batch_size, "--over-sampling-batch-size",
         "must be >= --rollout-batch-size")
    need(0 < args.rollout_top_p <= 1, "--rollout-top-p", f"must be in (0, 1], got {args.rollout_top_p}")
    need(args.rollout_temperature >= 0, "--rollout-temperature", "must be >= 0")
    need(args.request_timeout > 0, "--request-timeout", "must be > 0")
    need(args.abort_timeout >= 0, "--abort-timeout", f"must be >= 0 seconds, got {args.abort_timeout}")
    if args.max_staleness is not None:
        need(args.max_staleness >= 0, "--max-staleness", f"must be >= 0 weight versions, got {args.max_staleness}")
    if args.mask_offpolicy_in_partial_rollout and not args.partial_rollout:
        logger.warning("--mask-offpolicy-in-partial-rollout has no effect without --partial-rollout")
    if args.num_steps_per_rollout is not None:
        need(args.num_steps_per_rollout >= 1, "--num-steps-per-rollout", "must be >= 1")
    if args.num_epoch is not None:
        need(args.num_epoch >= 1, "--num-epoch", "must be >= 1")
        need(args.rollout_global_dataset, "--num-epoch", "needs the global dataset (drop "
                                                         "--disable-rollout-global-dataset, or set --num-rollout)")
    if args.rollout_max_context_len is not None:
        need(args.rollout_max_context_len > 1, "--rollout-max-context-len", "must be > 1")
        need(args.rollout_max_prompt_len <= args.rollout_max_context_len - 1, "--rollout-max-prompt-len",
             f"must be < --rollout-max-context-len ({args.rollout_max_context_len}) so one token can be generated")
    need((args.sglang_router_ip is None) == (args.sglang_router_port is None),
         "--sglang-router-ip/--sglang-router-port", "give both or neither")
    if args.eval_interval is not None:
        need(args.eval_interval >= 1, "--eval-interval", "must be >= 1")
        need(bool(args.eval_datasets), "--eval-interval", "needs --eval-prompt-data or --eval-config")
    if args.save_interval is not None:
        need(args.save is not None, "--save-interval", "needs --save")
    need(not (args.kl_coef != 0 and args.kl_loss_coef != 0), "--kl-coef/--kl-loss-coef", "set only one of them")
    if args.advantage_estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        need(args.normalize_advantages, "--advantage-estimator",
             f"{args.advantage_estimator} needs --normalize-advantages (as in slime)")
    if args.use_dynamic_batch_size:
        need(args.max_tokens_per_gpu is not None, "--use-dynamic-batch-size", "needs --max-tokens-per-gpu")
    if args.balance_by_flops:
        need(args.use_dynamic_batch_size, "--balance-by-flops", "needs --use-dynamic-batch-size")
    need(not (args.only_train_params_name_list and args.freeze_params_name_list),
         "--only-train-params-name-list/--freeze-params-name-list", "give only one of them")
    if args.use_opd:
        need(args.opd_type is not None, "--opd-type", "required with --use-opd (sglang or megatron)")
    else:
        need(args.opd_teacher_load is None, "--opd-teacher-load", "is set but --use-opd is not")
    if args.save_debug_train_data is not None:
        need(args.save_debug_train_data != args.save_debug_rollout_data, "--save-debug-train-data",
             "must differ from --save-debug-rollout-data")
    if not isinstance(args.apply_chat_template_kwargs, dict):
        raise ArgError(f"--apply-chat-template-kwargs: must be a JSON object, got {args.apply_chat_template_kwargs!r}")
    if args.multimodal_keys is not None and not isinstance(args.multimodal_keys, dict):
        raise ArgError(f"--multimodal-keys: must be a JSON object like '{{\"image\": \"images\"}}', "
                       f"got {args.multimodal_keys!r}")
    for path in (args.hf_checkpoint,):
        if path is not None:
            need(Path(path).is_dir(), "--hf-checkpoint", f"{path!r} is not a directory (a local HF model dir)")
    if args.prompt_data is not None and not args.load_debug_rollout_data:
        need(Path(parse_path_slice(args.prompt_data)[0]).is_file(), "--prompt-data",
             f"file not found: {args.prompt_data}")
    eval_flag = "--eval-config" if args.eval_config else "--eval-prompt-data"
    for d in args.eval_datasets:
        need(Path(d.file_path).is_file(), eval_flag, f"{d.name}: file not found: {d.file_path}")
    for flag in ("save_debug_rollout_data", "load_debug_rollout_data", "save_debug_train_data"):
        v = getattr(args, flag)
        if v is not None and args.num_rollout > 1 and "{rollout_id}" not in v:
            raise ArgError(f"{_flag(flag)}: needs a {{rollout_id}} placeholder when --num-rollout > 1")
    if args.rollout_backend == "sglang" and not args.load_debug_rollout_data:
        need(args.hf_checkpoint is not None, "--hf-checkpoint", "required with --rollout-backend sglang")
        need((args.rollout_num_gpus or 0) >= 1, "--rollout-num-gpus", "required with --rollout-backend sglang")
    _check_rm_type(args)
    _check_partial_rollout(args)
    _check_agent(args)


def _check_agent(args: argparse.Namespace) -> None:
    """The agent rollout's flags (`slime.agent.flags.check_agent_args`), refused at start."""
    from slime.agent.flags import check_agent_args

    try:
        check_agent_args(args)
    except ValueError as e:
        raise ArgError(str(e)) from None


def _check_partial_rollout(args: argparse.Namespace) -> None:
    """--partial-rollout with a custom generate function that cannot continue a sample: refused at start."""
    if not (args.partial_rollout and args.custom_generate_function_path):
        return
    from slime.rollout.partial_rollout import check_generate_function

    try:
        check_generate_function(args)
    except (ValueError, ImportError, AttributeError) as e:
        msg = str(e)
        raise ArgError(msg if msg.startswith("--") else f"--custom-generate-function-path: {msg}") from None


def default_cache_dir() -> Path:
    return Path(os.environ.get("SLIME_CACHE") or Path.home() / ".cache" / "slime")
