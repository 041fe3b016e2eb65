"""Flags the user set that this project accepts but does not act on, said once at start-up.

Every slime and Megatron flag parses (`upstream_flags.py`), so a run script moves over unchanged; most
of them change nothing here. `unused_flags_line(parser, args)` lists the ones set to a non-default
value, grouped with the reason, so nobody believes delta weight sync or a Megatron parallelism option
took effect. `ACTED_ON` names the upstream flags our code does read (tests check that each is read
somewhere in `slime/`); SGLang server options (`--sglang-*` passthrough) count as unused with the
embedded engine (`--rollout-backend hf`).
"""

from __future__ import annotations

import argparse
from typing import Any

from slime.fleet.router_options import not_passed

# upstream-registered flags (by dest) that this project reads and honours (on-policy distillation: --use-opd,
# --opd-kl-coef and --opd-type sglang; the megatron teacher's --opd-teacher-* are not); each has a test that
# changes it and sees a difference, or is on that test's list still to prove (tests/test_flag_effects.py).
# Filled by `finalize` as slime fills them but read by nothing here, so named when set: --log-probs-max-tokens-
# per-gpu, --use-routing-replay, --use-rollout-routing-replay, --offload-train, --eval-max-context-len.
# Named too: --sglang-config (slime's engine-deployment YAML of server groups, not SGLang's own --config),
# --trust-remote-code (Megatron's tokenizer option; SGLang engines are given it always, as slime's are) and
# --num-workers (Megatron's data-loader processes; there is no data loader here).
ACTED_ON = frozenset(
    {
        "actor_num_gpus_per_node",
        "actor_num_nodes",
        "adam_beta1",
        "adam_beta2",
        "adam_eps",
        "advantage_estimator",
        "apply_chat_template_kwargs",
        "balance_by_flops",
        "balance_data",
        "buffer_filter_path",
        "calculate_per_token_loss",
        "check_weight_update_equal",
        "ckpt_step",
        "clip_grad",
        "colocate",
        "custom_advantage_function_path",
        "custom_config_path",
        "custom_convert_samples_to_train_data_path",
        "custom_eval_rollout_log_function_path",
        "custom_loss_function_path",
        "custom_pg_loss_reducer_function_path",
        "custom_reward_post_process_path",
        "custom_rollout_log_function_path",
        "custom_tis_function_path",
        "data_source_path",
        "dump_details",
        "entropy_coef",
        "eps_clip",
        "eps_clip_c",
        "eps_clip_high",
        "eval_config",
        "eval_min_new_tokens",
        "eval_reward_key",
        "eval_tool_key",
        "eval_top_k",
        "ffn_hidden_size",
        "freeze_params_name_list",
        "gamma",
        "get_mismatch_metrics",
        "grpo_std_normalization",
        "hidden_size",
        "kl_coef",
        "kl_loss_coef",
        "kl_loss_type",
        "kv_channels",
        "loss_mask_type",
        "loss_type",
        "lr",
        "lr_warmup_iters",
        "max_tokens_per_gpu",
        "micro_batch_size",
        "microbatch_group_size_per_vp_stage",
        "moe_ffn_hidden_size",
        "moe_layer_freq",
        "moe_router_topk",
        "moe_shared_expert_intermediate_size",
        "no_load_optim",
        "no_save_optim",
        "normalize_advantages",
        "num_attention_heads",
        "num_epoch",
        "num_experts",
        "num_layers",
        "num_query_groups",
        "num_steps_per_rollout",
        "offload_rollout",
        "only_train_params_name_list",
        "opd_kl_coef",
        "opd_type",
        "optimizer",
        "ref_load",
        "rewards_normalization",
        "rm_url",
        "rollout_all_samples_process_path",
        "rollout_data_postprocess_path",
        "rollout_external_engine_addrs",
        "rollout_global_dataset",
        "rollout_sample_filter_path",
        "rollout_sample_hook_path",
        "save_interval",
        "seed",
        "tis_clip",
        "tis_clip_low",
        "update_weight_buffer_size",
        "update_weights_interval",
        "use_dynamic_batch_size",
        "use_kl_loss",
        "use_opd",
        "use_rollout_logprobs",
        "use_tis",
        "use_unbiased_kl",
        "vocab_size",
        "weight_decay",
    }
)

# why a group of upstream flags does nothing here (group title after "upstream ")
REASONS = {
    "megatron": "Megatron-LM trainer options (the trainer here is a torch one; parallelism, kernels and "
    "checkpoint formats are Megatron's)",
    "slime: train": "slime trainer options this trainer does not implement (e.g. delta weight sync)",
    "slime: sglang": "SGLang server options",
    "slime: sglang_router": "router options (the router is started with ours)",
    "slime: wandb": "wandb options beyond ours",
    "slime: tensorboard": "tensorboard logging (not implemented)",
    "slime: fault_tolerance": "slime's fault-tolerance options (the fleet restarts engines its own way)",
}
DEFAULT_REASON = "not implemented here"
# single flags whose reason is not their group's: read by a plugin only, which runs here
_BUFFER_PLUGIN = "read only by a rollout function that asks for it (slime's rollout-buffer example, which runs here)"
FLAG_REASONS = {
    "rollout_buffer_url": _BUFFER_PLUGIN,
    "rollout_task_type": _BUFFER_PLUGIN,
    "fetch_trajectory_retry_times": _BUFFER_PLUGIN,
}
SGLANG_PASSTHROUGH = "slime: sglang passthrough"


def _title_key(title: str) -> str:
    """'upstream megatron: training' -> 'megatron'; 'upstream slime: train' -> 'slime: train'."""
    key = title.removeprefix("upstream ").strip()
    return "megatron" if key.startswith("megatron") else key


def _default(action: argparse.Action) -> Any:
    """The default as parsed: argparse runs `type` over a string default (JSON '{}' -> {})."""
    if isinstance(action.default, str) and action.type is not None:
        try:
            return action.type(action.default)
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            return action.default
    return action.default


def _is_set(default: Any, value: Any) -> bool:
    """Set by the user: differs from what an empty command line gives, whatever its type (a `--disable-x`
    store_false flag set is False against a True default); an empty value where the default is None is not."""
    return value != default and not (default is None and value in (None, False, []))


# SGLang server options the rollout itself reads (slime does too): sampling seeds per sample of a group
ROLLOUT_READS_SGLANG = {"enable_deterministic_inference"}


def unused_flags(parser: argparse.ArgumentParser, args: Any) -> dict[str, list[str]]:
    """{reason: [flag, ...]} of the flags set to a non-default value that nothing here acts on."""
    out: dict[str, list[str]] = {}
    # what an empty command line gives: several upstream flags share one dest (Megatron's --enable-chunked-prefill
    # and --disable-chunked-prefill), and the namespace holds the first one's default, not each action's
    baseline = vars(parser.parse_known_args([])[0])
    for group in parser._action_groups:  # noqa: SLF001 - the groups are how upstream flags are told apart
        if not (group.title or "").startswith("upstream"):
            continue
        reason = REASONS.get(_title_key(group.title), DEFAULT_REASON)
        for action in group._group_actions:  # noqa: SLF001
            if action.dest not in ACTED_ON and _is_set(baseline.get(action.dest), getattr(args, action.dest, None)):
                out.setdefault(FLAG_REASONS.get(action.dest, reason), []).append(action.option_strings[0])
    kept = not_passed(args)
    if kept:
        out.setdefault(
            "sglang-router options slime keeps for itself (its engines, its retries, metrics on 127.0.0.1)", []
        ).extend(kept)
    if args.rollout_backend == "hf":
        extra = sorted(set(getattr(args, "sglang_extra_args", None) or {}) - ROLLOUT_READS_SGLANG)
        if extra:
            out.setdefault("SGLang server options (the embedded engine has none of them)", []).extend(
                f"--sglang-{name.replace('_', '-')}" for name in extra
            )
    return out


def unused_flags_line(parser: argparse.ArgumentParser, args: Any) -> str | None:
    """One line for the start-up log, or None when every flag the user set takes effect."""
    groups = unused_flags(parser, args)
    if not groups:
        return None
    parts = [f"{reason}: {' '.join(sorted(flags))}" for reason, flags in sorted(groups.items())]
    count = sum(len(f) for f in groups.values())
    return f"{count} flag(s) accepted but not acted on -- " + "; ".join(parts)
