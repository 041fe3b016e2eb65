"""`finalize_args`: what a parsed (or hand-built) namespace gets before use: missing defaults,
`--custom-config-path`, the values upstream slime derives from others (engines from GPUs, batch sizes,
`num_rollout` from `--num-epoch`, offload, eval datasets), then `validate_args`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from slime.cli.validate import ArgError, validate_args
from slime.rollout.data_source import parse_path_slice
from slime.utils.devices import cuda_available
from slime.utils.eval_config import EvalConfigError, resolve_eval_datasets
from slime.utils.plugin_args import completed

logger = logging.getLogger(__name__)


_cuda_available = cuda_available  # the name slime.cli.args re-exports


def apply_custom_config(args: argparse.Namespace) -> None:
    """`--custom-config-path FILE.yaml`: each top-level key is set on args (upstream: overrides, and new
    keys for custom functions)."""
    path = args.custom_config_path
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


def complete_namespace(args: Any) -> Any:
    """The one place a namespace built by hand (a test, a script, slime's train.py) gets every flag it lacks,
    with the parser's default (the packages' configs' defaults, `slime.utils.flag_config`); returns it.
    The same completion our plugin entry points apply (`slime.utils.plugin_args.completed`)."""
    return completed(args)


_fill_defaults = complete_namespace  # the name slime.cli.args re-exports


def _count_rows(path: str) -> int:
    """Rows of a prompt file (after its @[start:end] slice), for --num-epoch; counted, not read."""
    from slime.rollout.prompt_index import count_rows

    return count_rows(path)


def finalize_args(args: argparse.Namespace) -> argparse.Namespace:
    """Apply --custom-config-path, fill what upstream slime derives, then validate.

    A namespace built by hand (not by parse_args) gets every missing flag's default first.
    """
    completed(args)
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
    if args.num_steps_per_rollout:
        gbs = args.rollout_batch_size * args.n_samples_per_prompt // args.num_steps_per_rollout
        if args.global_batch_size is not None and args.global_batch_size != gbs:
            raise ArgError(
                f"--global-batch-size {args.global_batch_size} disagrees with --num-steps-per-rollout "
                f"{args.num_steps_per_rollout} (rollout_batch_size * n_samples_per_prompt // steps = {gbs})"
            )
        args.global_batch_size = gbs
    if args.global_batch_size is None:
        args.global_batch_size = args.rollout_batch_size * args.n_samples_per_prompt
    if args.eval_max_response_len is None:
        args.eval_max_response_len = args.rollout_max_response_len
    if args.start_rollout_id is None:
        args.start_rollout_id = 0
    if args.num_rollout is None:
        if args.num_epoch is not None and args.prompt_data and Path(parse_path_slice(args.prompt_data)[0]).is_file():
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
