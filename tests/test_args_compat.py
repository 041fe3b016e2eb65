"""Upstream slime's command-line surface: every flag of slime parses with slime's default, whole run
scripts (Megatron flags included) parse, `path@[start:end]`, `--eval-config`, `--custom-config-path`,
`--apply-chat-template-kwargs`, and a truly unknown flag is an error naming it.

The fixtures below are data copied from upstream THUDM/slime (slime/utils/arguments.py and
slime/backends/sglang_utils/arguments.py; the argument lists of examples/search-r1, retool,
multi_agent and fully_async with the MODEL_ARGS they source), so this test does not trust the
generated slime/cli/upstream_flags.json it checks.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import types
from pathlib import Path

import pytest

from slime.cli.args import ArgError, build_parser, finalize_args, parse_args
from slime.utils.eval_config import EvalDatasetConfig
from slime.rollout.data_source import DataError, build_prompt_samples, parse_path_slice

ROOT = Path(__file__).resolve().parents[1]

# flag, dest, kind, slime's default, choices   (THUDM/slime@624b824a898a)
SLIME_FLAGS = [
    ("--actor-num-gpus-per-node", "actor_num_gpus_per_node", "int", 8, None),
    ("--actor-num-nodes", "actor_num_nodes", "int", 1, None),
    (
        "--advantage-estimator",
        "advantage_estimator",
        "str",
        "grpo",
        ["grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"],
    ),
    ("--allgather-cp", "allgather_cp", "store_true", False, None),
    ("--apply-chat-template", "apply_chat_template", "store_true", False, None),
    ("--apply-chat-template-kwargs", "apply_chat_template_kwargs", "json", {}, None),
    ("--async-save", "async_save", "store_true", False, None),
    ("--balance-by-flops", "balance_by_flops", "store_true", False, None),
    ("--balance-data", "balance_data", "store_true", False, None),
    ("--buffer-filter-path", "buffer_filter_path", "str", None, None),
    ("--calculate-per-token-loss", "calculate_per_token_loss", "store_true", False, None),
    ("--check-weight-update-equal", "check_weight_update_equal", "store_true", False, None),
    ("--ci-disable-kl-checker", "ci_disable_kl_checker", "store_true", False, None),
    ("--ci-load-grad-norm", "ci_load_grad_norm", "str", None, None),
    ("--ci-save-grad-norm", "ci_save_grad_norm", "str", None, None),
    ("--ci-test", "ci_test", "store_true", False, None),
    (
        "--ci-train-rollout-logprob-abs-diff-threshold",
        "ci_train_rollout_logprob_abs_diff_threshold",
        "float",
        0.1,
        None,
    ),
    ("--clip-grad", "clip_grad", "float", 1.0, None),
    ("--colocate", "colocate", "store_true", False, None),
    ("--custom-advantage-function-path", "custom_advantage_function_path", "str", None, None),
    ("--custom-config-path", "custom_config_path", "str", None, None),
    ("--custom-convert-samples-to-train-data-path", "custom_convert_samples_to_train_data_path", "str", None, None),
    ("--custom-eval-rollout-log-function-path", "custom_eval_rollout_log_function_path", "str", None, None),
    ("--custom-generate-function-path", "custom_generate_function_path", "str", None, None),
    ("--custom-loss-function-path", "custom_loss_function_path", "str", None, None),
    ("--custom-megatron-before-log-prob-hook-path", "custom_megatron_before_log_prob_hook_path", "str", None, None),
    ("--custom-megatron-before-train-step-hook-path", "custom_megatron_before_train_step_hook_path", "str", None, None),
    ("--custom-megatron-init-path", "custom_megatron_init_path", "str", None, None),
    ("--custom-model-provider-path", "custom_model_provider_path", "str", None, None),
    ("--custom-pg-loss-reducer-function-path", "custom_pg_loss_reducer_function_path", "str", None, None),
    ("--custom-reward-post-process-path", "custom_reward_post_process_path", "str", None, None),
    ("--custom-rm-path", "custom_rm_path", "str", None, None),
    ("--custom-rollout-log-function-path", "custom_rollout_log_function_path", "str", None, None),
    ("--custom-tis-function-path", "custom_tis_function_path", "str", None, None),
    ("--custom-update-weight-post-write-path", "custom_update_weight_post_write_path", "str", None, None),
    ("--data-pad-size-multiplier", "data_pad_size_multiplier", "int", 128, None),
    ("--data-source-path", "data_source_path", "str", "slime.rollout.data_source.RolloutDataSourceWithBuffer", None),
    ("--debug-rollout-only", "debug_rollout_only", "store_true", False, None),
    ("--debug-train-only", "debug_train_only", "store_true", False, None),
    ("--disable-compute-advantages-and-returns", "compute_advantages_and_returns", "store_false", True, None),
    ("--disable-grpo-std-normalization", "grpo_std_normalization", "store_false", True, None),
    ("--disable-rewards-normalization", "rewards_normalization", "store_false", True, None),
    ("--disable-rollout-global-dataset", "rollout_global_dataset", "store_false", True, None),
    ("--disable-wandb-random-suffix", "wandb_random_suffix", "store_false", True, None),
    ("--distributed-backend", "distributed_backend", "str", "nccl", ["nccl", "gloo"]),
    ("--distributed-timeout-minutes", "distributed_timeout_minutes", "int", 10, None),
    ("--dump-details", "dump_details", "str", None, None),
    ("--dynamic-sampling-filter-path", "dynamic_sampling_filter_path", "str", None, None),
    ("--enable-mtp-training", "enable_mtp_training", "store_true", False, None),
    ("--entropy-coef", "entropy_coef", "float", 0.0, None),
    ("--eps-clip", "eps_clip", "float", 0.2, None),
    ("--eps-clip-c", "eps_clip_c", "float", None, None),
    ("--eps-clip-high", "eps_clip_high", "float", None, None),
    ("--eval-config", "eval_config", "str", None, None),
    ("--eval-function-path", "eval_function_path", "str", None, None),
    ("--eval-input-key", "eval_input_key", "str", None, None),
    ("--eval-interval", "eval_interval", "int", None, None),
    ("--eval-label-key", "eval_label_key", "str", None, None),
    ("--eval-max-context-len", "eval_max_context_len", "int", None, None),
    ("--eval-max-prompt-len", "eval_max_prompt_len", "int", None, None),
    ("--eval-max-response-len", "eval_max_response_len", "int", None, None),
    ("--eval-min-new-tokens", "eval_min_new_tokens", "int", None, None),
    ("--eval-prompt-data", "eval_prompt_data", "str+", None, None),
    ("--eval-reward-key", "eval_reward_key", "str", None, None),
    ("--eval-temperature", "eval_temperature", "float", None, None),
    ("--eval-tool-key", "eval_tool_key", "str", None, None),
    ("--eval-top-k", "eval_top_k", "int", None, None),
    ("--eval-top-p", "eval_top_p", "float", None, None),
    ("--fetch-trajectory-retry-times", "fetch_trajectory_retry_times", "int", -1, None),
    ("--freeze-indexer", "freeze_indexer", "store_true", False, None),
    ("--freeze-params-name-list", "freeze_params_name_list", "str+", None, None),
    ("--gamma", "gamma", "float", 1.0, None),
    ("--get-mismatch-metrics", "get_mismatch_metrics", "store_true", False, None),
    ("--global-batch-size", "global_batch_size", "int", None, None),
    ("--group-rm", "group_rm", "store_true", False, None),
    ("--hf-checkpoint", "hf_checkpoint", "str", None, None),
    ("--http-proxy", "http_proxy", "str", None, None),
    ("--input-key", "input_key", "str", "input", None),
    ("--keep-old-actor", "keep_old_actor", "store_true", False, None),
    ("--kl-coef", "kl_coef", "float", 0.0, None),
    ("--kl-loss-coef", "kl_loss_coef", "float", 0.0, None),
    ("--kl-loss-type", "kl_loss_type", "str", "k1", ["k1", "k2", "k3", "low_var_kl"]),
    ("--label-key", "label_key", "str", None, None),
    ("--lambd", "lambd", "float", 1.0, None),
    ("--load", "load", "str", None, None),
    ("--load-debug-rollout-data", "load_debug_rollout_data", "str", None, None),
    ("--load-debug-rollout-data-subsample", "load_debug_rollout_data_subsample", "float", None, None),
    ("--load-forge-rollout-data", "load_forge_rollout_data", "str", None, None),
    ("--log-correct-samples", "log_correct_samples", "store_true", False, None),
    ("--log-multi-turn", "log_multi_turn", "store_true", False, None),
    ("--log-passrate", "log_passrate", "store_true", False, None),
    ("--log-probs-chunk-size", "log_probs_chunk_size", "int", -1, None),
    ("--log-probs-max-tokens-per-gpu", "log_probs_max_tokens_per_gpu", "int", None, None),
    ("--log-reward-category", "log_reward_category", "str", None, None),
    ("--loss-mask-type", "loss_mask_type", "str", "qwen", ["qwen", "qwen3", "qwen3_5", "distill_qwen"]),
    ("--loss-type", "loss_type", "str", "policy_loss", ["policy_loss", "sft_loss", "custom_loss"]),
    ("--lr", "lr", "float", 1e-06, None),
    ("--mask-offpolicy-in-partial-rollout", "mask_offpolicy_in_partial_rollout", "store_true", False, None),
    ("--max-tokens-per-gpu", "max_tokens_per_gpu", "int", None, None),
    ("--megatron-config-path", "megatron_config_path", "str", None, None),
    ("--megatron-deepgemm-forward-layers", "megatron_deepgemm_forward_layers", "int+", None, None),
    ("--megatron-deepgemm-forward-modules", "megatron_deepgemm_forward_modules", "str+", None, None),
    ("--megatron-deepgemm-moe-forward-layers", "megatron_deepgemm_moe_forward_layers", "int+", None, None),
    ("--megatron-deepgemm-moe-forward-modules", "megatron_deepgemm_moe_forward_modules", "str+", None, None),
    ("--memory-recorder", "memory_recorder", "str", "torch", ["torch", "memray"]),
    ("--memory-snapshot-dir", "memory_snapshot_dir", "str", ".", None),
    ("--memory-snapshot-num-steps", "memory_snapshot_num_steps", "int", None, None),
    ("--metadata-key", "metadata_key", "str", "metadata", None),
    ("--micro-batch-size", "micro_batch_size", "int", 1, None),
    ("--min-batch-collection-ratio", "min_batch_collection_ratio", "float", 1, None),
    ("--model-name", "model_name", "str", None, None),
    ("--mtp-loss-scaling-factor", "mtp_loss_scaling_factor", "float", 0.2, None),
    ("--mtp-num-layers", "mtp_num_layers", "int", None, None),
    ("--multimodal-keys", "multimodal_keys", "json", None, None),
    ("--n-samples-per-eval-prompt", "n_samples_per_eval_prompt", "int", 1, None),
    ("--n-samples-per-prompt", "n_samples_per_prompt", "int", 1, None),
    ("--no-save-optim", "no_save_optim", "store_true", False, None),
    ("--normalize-advantages", "normalize_advantages", "store_true", False, None),
    ("--num-critic-only-steps", "num_critic_only_steps", "int", 0, None),
    ("--num-epoch", "num_epoch", "int", None, None),
    ("--num-gpus-per-node", "num_gpus_per_node", "int", 8, None),
    ("--num-rollout", "num_rollout", "int", None, None),
    ("--num-steps-per-rollout", "num_steps_per_rollout", "int", None, None),
    ("--offload", "offload", "store_true", False, None),
    ("--offload-rollout", "offload_rollout", "boolean_optional", None, None),
    ("--offload-train", "offload_train", "boolean_optional", None, None),
    ("--only-train-params-name-list", "only_train_params_name_list", "str+", None, None),
    ("--opd-kl-coef", "opd_kl_coef", "float", 1.0, None),
    ("--opd-teacher-ckpt-step", "opd_teacher_ckpt_step", "int", None, None),
    ("--opd-teacher-load", "opd_teacher_load", "str", None, None),
    ("--opd-type", "opd_type", "str", None, ["sglang", "megatron"]),
    ("--opsm-delta", "opsm_delta", "float", 0.0001, None),
    ("--over-sampling-batch-size", "over_sampling_batch_size", "int", None, None),
    ("--padded-vocab-size", "padded_vocab_size", "int", None, None),
    ("--partial-rollout", "partial_rollout", "store_true", False, None),
    ("--prefill-num-servers", "prefill_num_servers", "int", None, None),
    (
        "--profile-target",
        "profile_target",
        "str+",
        ["train_overall"],
        ["train_overall", "train_actor", "train_log_probs"],
    ),
    ("--prompt-data", "prompt_data", "str", None, None),
    ("--qwen-gdn-backend", "qwen_gdn_backend", "str", "fla", ["fla", "flashqla"]),
    ("--recompute-loss-function", "recompute_loss_function", "store_true", False, None),
    ("--record-memory-history", "record_memory_history", "store_true", False, None),
    ("--ref-ckpt-step", "ref_ckpt_step", "int", None, None),
    ("--ref-load", "ref_load", "str", None, None),
    ("--ref-update-interval", "ref_update_interval", "int", None, None),
    ("--release-train", "release_train", "store_true", False, None),
    ("--reset-optimizer-states", "reset_optimizer_states", "store_true", False, None),
    ("--reward-key", "reward_key", "str", None, None),
    ("--rm-type", "rm_type", "str", None, None),
    ("--rm-url", "rm_url", "str", None, None),
    ("--rollout-all-samples-process-path", "rollout_all_samples_process_path", "str", None, None),
    ("--rollout-batch-size", "rollout_batch_size", "int", None, None),
    ("--rollout-buffer-url", "rollout_buffer_url", "str", None, None),
    ("--rollout-data-postprocess-path", "rollout_data_postprocess_path", "str", None, None),
    ("--rollout-data-transport", "rollout_data_transport", "str", "object-store", ["object-store", "nixl"]),
    ("--rollout-external-engine-addrs", "rollout_external_engine_addrs", "str+", None, None),
    ("--rollout-function-path", "rollout_function_path", "str", "slime.rollout.sglang_rollout.generate_rollout", None),
    ("--rollout-health-check-first-wait", "rollout_health_check_first_wait", "float", 0, None),
    ("--rollout-health-check-interval", "rollout_health_check_interval", "float", 30.0, None),
    ("--rollout-health-check-timeout", "rollout_health_check_timeout", "float", 30.0, None),
    ("--rollout-max-context-len", "rollout_max_context_len", "int", None, None),
    ("--rollout-max-prompt-len", "rollout_max_prompt_len", "int", None, None),
    ("--rollout-max-response-len", "rollout_max_response_len", "int", None, None),
    ("--rollout-num-gpus", "rollout_num_gpus", "int", None, None),
    ("--rollout-num-gpus-per-engine", "rollout_num_gpus_per_engine", "int", 1, None),
    ("--rollout-sample-filter-path", "rollout_sample_filter_path", "str", None, None),
    ("--rollout-sample-hook-path", "rollout_sample_hook_path", "append", [], None),
    ("--rollout-seed", "rollout_seed", "int", 42, None),
    ("--rollout-shuffle", "rollout_shuffle", "store_true", False, None),
    ("--rollout-skip-special-tokens", "rollout_skip_special_tokens", "store_true", False, None),
    ("--rollout-stop", "rollout_stop", "str+", None, None),
    ("--rollout-stop-token-ids", "rollout_stop_token_ids", "int+", None, None),
    ("--rollout-task-type", "rollout_task_type", "str", "math", None),
    ("--rollout-temperature", "rollout_temperature", "float", 1.0, None),
    ("--rollout-top-k", "rollout_top_k", "int", -1, None),
    ("--rollout-top-p", "rollout_top_p", "float", 1.0, None),
    ("--save", "save", "str", None, None),
    ("--save-debug-rollout-data", "save_debug_rollout_data", "str", None, None),
    ("--save-debug-train-data", "save_debug_train_data", "str", None, None),
    ("--save-hf", "save_hf", "str", None, None),
    ("--save-interval", "save_interval", "int", None, None),
    ("--seed", "seed", "int", 1234, None),
    ("--sglang-config", "sglang_config", "str", None, None),
    ("--sglang-pipeline-parallel-size", "sglang_pipeline_parallel_size", "int", 1, None),
    ("--sglang-pp-size", "sglang_pp_size", "int", 1, None),
    ("--sglang-router-ip", "sglang_router_ip", "str", None, None),
    ("--sglang-router-port", "sglang_router_port", "int", None, None),
    ("--sglang-router-request-timeout-secs", "sglang_router_request_timeout_secs", "int", 14400, None),
    ("--sglang-server-concurrency", "sglang_server_concurrency", "int", 512, None),
    ("--skip-eval-before-train", "skip_eval_before_train", "store_true", False, None),
    ("--start-rollout-id", "start_rollout_id", "int", None, None),
    ("--tb-experiment-name", "tb_experiment_name", "str", None, None),
    ("--tb-project-name", "tb_project_name", "str", None, None),
    ("--tis-clip", "tis_clip", "float", 2.0, None),
    ("--tis-clip-low", "tis_clip_low", "float", 0, None),
    ("--tool-key", "tool_key", "str", "tools", None),
    ("--train-backend", "train_backend", "str", "megatron", ["megatron"]),
    ("--train-env-vars", "train_env_vars", "json", {}, None),
    ("--update-weight-buffer-size", "update_weight_buffer_size", "int", 536870912, None),
    (
        "--update-weight-delta-checksum",
        "update_weight_delta_checksum",
        "str",
        "xxh3-128",
        ["xxh3-128", "blake3", "adler32"],
    ),
    ("--update-weight-delta-encoding", "update_weight_delta_encoding", "str", "xor", ["xor", "overwrite"]),
    ("--update-weight-disk-dir", "update_weight_disk_dir", "str", None, None),
    ("--update-weight-disk-keep-files", "update_weight_disk_keep_files", "store_true", False, None),
    ("--update-weight-local-checkpoint-dir", "update_weight_local_checkpoint_dir", "str", None, None),
    ("--update-weight-mode", "update_weight_mode", "str", "full", ["full", "delta"]),
    ("--update-weight-transport", "update_weight_transport", "str", "nccl", ["nccl", "disk"]),
    ("--update-weights-interval", "update_weights_interval", "int", 1, None),
    ("--use-distributed-post", "use_distributed_post", "store_true", False, None),
    ("--use-dynamic-batch-size", "use_dynamic_batch_size", "store_true", False, None),
    ("--use-fault-tolerance", "use_fault_tolerance", "store_true", False, None),
    ("--use-kl-loss", "use_kl_loss", "store_true", False, None),
    ("--use-opd", "use_opd", "store_true", False, None),
    ("--use-opsm", "use_opsm", "store_true", False, None),
    ("--use-rollout-entropy", "use_rollout_entropy", "store_true", False, None),
    ("--use-rollout-logprobs", "use_rollout_logprobs", "store_true", False, None),
    ("--use-rollout-routing-replay", "use_rollout_routing_replay", "store_true", False, None),
    ("--use-routing-replay", "use_routing_replay", "store_true", False, None),
    ("--use-stateless-adam", "use_stateless_adam", "store_true", False, None),
    ("--use-tensorboard", "use_tensorboard", "store_true", False, None),
    ("--use-tis", "use_tis", "store_true", False, None),
    ("--use-unbiased-kl", "use_unbiased_kl", "store_true", False, None),
    ("--use-wandb", "use_wandb", "store_true", False, None),
    ("--value-clip", "value_clip", "float", 0.2, None),
    ("--wandb-always-use-train-step", "wandb_always_use_train_step", "store_true", False, None),
    ("--wandb-dir", "wandb_dir", "str", None, None),
    ("--wandb-group", "wandb_group", "str", None, None),
    ("--wandb-host", "wandb_host", "str", None, None),
    ("--wandb-key", "wandb_key", "str", None, None),
    ("--wandb-mode", "wandb_mode", "str", None, ["online", "offline", "disabled"]),
    ("--wandb-project", "wandb_project", "str", None, None),
    ("--wandb-run-id", "wandb_run_id", "str", None, None),
    ("--wandb-team", "wandb_team", "str", None, None),
]

RUN_SCRIPTS = {
    # examples/search-r1/run_qwen2.5_3B.sh (+ the MODEL_ARGS of the scripts/models/*.sh it sources)
    "search-r1": [
        "--actor-num-nodes",
        "1",
        "--actor-num-gpus-per-node",
        "4",
        "--rollout-num-gpus",
        "4",
        "--colocate",
        "--swiglu",
        "--num-layers",
        "36",
        "--hidden-size",
        "2048",
        "--ffn-hidden-size",
        "11008",
        "--num-attention-heads",
        "16",
        "--use-rotary-position-embeddings",
        "--disable-bias-linear",
        "--add-qkv-bias",
        "--normalization",
        "RMSNorm",
        "--norm-epsilon",
        "1e-6",
        "--rotary-base",
        "1000000",
        "--group-query-attention",
        "--num-query-groups",
        "2",
        "--vocab-size",
        "151936",
        "--hf-checkpoint",
        "/root/Qwen2.5-3B/",
        "--ref-load",
        "/root/Qwen2.5-3B_torch_dist/",
        "--prompt-data",
        "/root/Search-R1/data/nq_hotpotqa_train/train.parquet",
        "--input-key",
        "prompt",
        "--label-key",
        "reward_model",
        "--apply-chat-template",
        "--rollout-shuffle",
        "--num-rollout",
        "3000",
        "--rollout-batch-size",
        "32",
        "--n-samples-per-prompt",
        "8",
        "--rollout-max-response-len",
        "512",
        "--rollout-temperature",
        "1",
        "--global-batch-size",
        "256",
        "--balance-data",
        "--optimizer",
        "adam",
        "--lr",
        "1e-6",
        "--lr-decay-style",
        "constant",
        "--weight-decay",
        "0.01",
        "--adam-beta1",
        "0.9",
        "--adam-beta2",
        "0.98",
        "--advantage-estimator",
        "grpo",
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.001",
        "--kl-loss-type",
        "low_var_kl",
        "--entropy-coef",
        "0.00",
        "--eps-clip",
        "0.2",
        "--eps-clip-high",
        "0.28",
        "--tensor-model-parallel-size",
        "2",
        "--sequence-parallel",
        "--pipeline-model-parallel-size",
        "1",
        "--context-parallel-size",
        "1",
        "--expert-model-parallel-size",
        "1",
        "--expert-tensor-parallel-size",
        "1",
        "--recompute-granularity",
        "full",
        "--recompute-method",
        "uniform",
        "--recompute-num-layers",
        "1",
        "--use-dynamic-batch-size",
        "--max-tokens-per-gpu",
        "9216",
        "--rollout-num-gpus-per-engine",
        "2",
        "--sglang-mem-fraction-static",
        "0.7",
        "--attention-dropout",
        "0.0",
        "--hidden-dropout",
        "0.0",
        "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32",
        "--attention-backend",
        "flash",
        "--custom-generate-function-path",
        "generate_with_search.generate",
        "--custom-rm-path",
        "generate_with_search.reward_func",
    ],
    # examples/retool/retool_qwen3_4b_rl.sh (+ the MODEL_ARGS of the scripts/models/*.sh it sources)
    "retool": [
        "--actor-num-nodes",
        "1",
        "--actor-num-gpus-per-node",
        "4",
        "--colocate",
        "--swiglu",
        "--num-layers",
        "36",
        "--hidden-size",
        "2560",
        "--ffn-hidden-size",
        "9728",
        "--num-attention-heads",
        "32",
        "--group-query-attention",
        "--num-query-groups",
        "8",
        "--use-rotary-position-embeddings",
        "--disable-bias-linear",
        "--normalization",
        "RMSNorm",
        "--norm-epsilon",
        "1e-6",
        "--rotary-base",
        "1000000",
        "--vocab-size",
        "151936",
        "--kv-channels",
        "128",
        "--qk-layernorm",
        "--hf-checkpoint",
        "/root/font-info/qwen3-4b-sft",
        "--ref-load",
        "/root/font-info/qwen3-4b-sft_torch_dist",
        "--save",
        "/root/font-info/qwen3-4b-sft/qwen3-4b-sft-multi-turn/",
        "--save-interval",
        "20",
        "--rotary-base",
        "5000000",
        "--prompt-data",
        "/root/dapo-math-17k/dapo-math-17k.jsonl",
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rollout-shuffle",
        "--reward-key",
        "score",
        "--num-rollout",
        "3000",
        "--rollout-batch-size",
        "32",
        "--n-samples-per-prompt",
        "8",
        "--rollout-max-response-len",
        "8192",
        "--rollout-temperature",
        "1",
        "--global-batch-size",
        "256",
        "--balance-data",
        "--optimizer",
        "adam",
        "--lr",
        "1e-6",
        "--lr-decay-style",
        "constant",
        "--weight-decay",
        "0.1",
        "--adam-beta1",
        "0.9",
        "--adam-beta2",
        "0.98",
        "--advantage-estimator",
        "grpo",
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.00",
        "--kl-loss-type",
        "low_var_kl",
        "--entropy-coef",
        "0.00",
        "--eps-clip",
        "0.2",
        "--eps-clip-high",
        "0.28",
        "--use-wandb",
        "--wandb-project",
        "slime-dapo",
        "--wandb-group",
        "qwen3-4B-test-multi-turn",
        "--wandb-key",
        "KEY",
        "--tensor-model-parallel-size",
        "2",
        "--sequence-parallel",
        "--pipeline-model-parallel-size",
        "1",
        "--context-parallel-size",
        "1",
        "--expert-model-parallel-size",
        "1",
        "--expert-tensor-parallel-size",
        "1",
        "--recompute-granularity",
        "full",
        "--recompute-method",
        "uniform",
        "--recompute-num-layers",
        "1",
        "--use-dynamic-batch-size",
        "--max-tokens-per-gpu",
        "9216",
        "--eval-interval",
        "20",
        "--eval-prompt-data",
        "aime",
        "/root/aime-2024/aime-2024.jsonl",
        "--n-samples-per-eval-prompt",
        "16",
        "--eval-max-response-len",
        "16384",
        "--eval-top-p",
        "1",
        "--rollout-num-gpus-per-engine",
        "2",
        "--sglang-mem-fraction-static",
        "0.7",
        "--attention-dropout",
        "0.0",
        "--hidden-dropout",
        "0.0",
        "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32",
        "--attention-backend",
        "flash",
        "--custom-generate-function-path",
        "generate_with_retool.generate",
        "--custom-rm-path",
        "generate_with_retool.reward_func",
    ],
    # examples/multi_agent/run-qwen3-30B-A3B-multi-agent.sh (+ the MODEL_ARGS of the scripts/models/*.sh it sources)
    "multi_agent": [
        "--actor-num-nodes",
        "1",
        "--actor-num-gpus-per-node",
        "8",
        "--colocate",
        "--disable-bias-linear",
        "--qk-layernorm",
        "--group-query-attention",
        "--num-attention-heads",
        "32",
        "--num-query-groups",
        "4",
        "--kv-channels",
        "128",
        "--num-layers",
        "48",
        "--hidden-size",
        "2048",
        "--ffn-hidden-size",
        "6144",
        "--normalization",
        "RMSNorm",
        "--position-embedding-type",
        "rope",
        "--norm-epsilon",
        "1e-6",
        "--rotary-percent",
        "1.0",
        "--swiglu",
        "--untie-embeddings-and-output-weights",
        "--vocab-size",
        "151936",
        "--rotary-base",
        "1000000",
        "--moe-ffn-hidden-size",
        "768",
        "--moe-router-score-function",
        "softmax",
        "--moe-token-dispatcher-type",
        "alltoall",
        "--moe-router-topk",
        "8",
        "--moe-layer-freq",
        "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]",
        "--num-experts",
        "128",
        "--moe-grouped-gemm",
        "--moe-token-drop-policy",
        "probs",
        "--moe-router-dtype",
        "fp32",
        "--moe-permute-fusion",
        "--moe-aux-loss-coeff",
        "0",
        "--hf-checkpoint",
        "/root/Qwen3-30B-A3B",
        "--ref-load",
        "/root/Qwen3-30B-A3B_torch_dist",
        "--load",
        "/root/Qwen3-4B_slime/",
        "--save",
        "/root/Qwen3-4B_slime/",
        "--save-interval",
        "20",
        "--custom-generate-function-path",
        "examples.multi_agent.rollout_with_multi_agents.generate_with_multi_agents",
        "--prompt-data",
        "/root/dapo-math-17k/dapo-math-17k.jsonl",
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rollout-shuffle",
        "--rm-type",
        "deepscaler",
        "--num-rollout",
        "3000",
        "--rollout-batch-size",
        "32",
        "--n-samples-per-prompt",
        "8",
        "--rollout-max-context-len",
        "16384",
        "--rollout-max-response-len",
        "8192",
        "--rollout-temperature",
        "1",
        "--global-batch-size",
        "256",
        "--balance-data",
        "--optimizer",
        "adam",
        "--lr",
        "1e-6",
        "--lr-decay-style",
        "constant",
        "--weight-decay",
        "0.1",
        "--adam-beta1",
        "0.9",
        "--adam-beta2",
        "0.98",
        "--optimizer-cpu-offload",
        "--overlap-cpu-optimizer-d2h-h2d",
        "--use-precision-aware-optimizer",
        "--advantage-estimator",
        "grpo",
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.00",
        "--kl-loss-type",
        "low_var_kl",
        "--entropy-coef",
        "0.00",
        "--eps-clip",
        "0.2",
        "--eps-clip-high",
        "0.28",
        "--use-rollout-logprobs",
        "--tensor-model-parallel-size",
        "4",
        "--sequence-parallel",
        "--pipeline-model-parallel-size",
        "1",
        "--context-parallel-size",
        "1",
        "--expert-model-parallel-size",
        "8",
        "--expert-tensor-parallel-size",
        "1",
        "--recompute-granularity",
        "full",
        "--recompute-method",
        "uniform",
        "--recompute-num-layers",
        "1",
        "--use-dynamic-batch-size",
        "--max-tokens-per-gpu",
        "20480",
        "--n-samples-per-eval-prompt",
        "16",
        "--eval-max-response-len",
        "16384",
        "--eval-top-p",
        "1",
        "--rollout-num-gpus-per-engine",
        "8",
        "--sglang-mem-fraction-static",
        "0.7",
        "--sglang-cuda-graph-bs",
        "1",
        "2",
        "4",
        "8",
        "16",
        "24",
        "32",
        "40",
        "48",
        "56",
        "64",
        "72",
        "80",
        "88",
        "96",
        "104",
        "112",
        "120",
        "128",
        "136",
        "144",
        "152",
        "160",
        "168",
        "176",
        "184",
        "192",
        "200",
        "208",
        "216",
        "224",
        "232",
        "240",
        "248",
        "256",
        "--attention-dropout",
        "0.0",
        "--hidden-dropout",
        "0.0",
        "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32",
        "--attention-backend",
        "flash",
    ],
    # examples/fully_async/run-qwen2.5-0.5B-fully_async.sh (+ the MODEL_ARGS of the scripts/models/*.sh it sources)
    "fully_async": [
        "--actor-num-nodes",
        "1",
        "--actor-num-gpus-per-node",
        "1",
        "--rollout-num-gpus",
        "3",
        "--swiglu",
        "--num-layers",
        "24",
        "--hidden-size",
        "896",
        "--ffn-hidden-size",
        "4864",
        "--num-attention-heads",
        "14",
        "--use-rotary-position-embeddings",
        "--disable-bias-linear",
        "--add-qkv-bias",
        "--normalization",
        "RMSNorm",
        "--norm-epsilon",
        "1e-6",
        "--rotary-base",
        "1000000",
        "--group-query-attention",
        "--num-query-groups",
        "2",
        "--vocab-size",
        "151936",
        "--hf-checkpoint",
        "/root/models/Qwen2.5-0.5B-Instruct",
        "--ref-load",
        "/root/models/Qwen2.5-0.5B-Instruct_torch_dist",
        "--save",
        "/tmp/slime_fully_async_demo/",
        "--save-interval",
        "9999",
        "--rollout-function-path",
        "slime.rollout.fully_async_rollout.generate_rollout_fully_async",
        "--prompt-data",
        "/root/datasets/dapo-math-17k/dapo-math-17k.jsonl",
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rollout-shuffle",
        "--rm-type",
        "deepscaler",
        "--num-rollout",
        "3",
        "--rollout-batch-size",
        "8",
        "--n-samples-per-prompt",
        "4",
        "--rollout-max-response-len",
        "1024",
        "--rollout-temperature",
        "1",
        "--global-batch-size",
        "32",
        "--balance-data",
        "--optimizer",
        "adam",
        "--lr",
        "1e-6",
        "--lr-decay-style",
        "constant",
        "--weight-decay",
        "0.1",
        "--adam-beta1",
        "0.9",
        "--adam-beta2",
        "0.98",
        "--advantage-estimator",
        "grpo",
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.00",
        "--kl-loss-type",
        "low_var_kl",
        "--entropy-coef",
        "0.00",
        "--eps-clip",
        "0.2",
        "--eps-clip-high",
        "0.28",
        "--tensor-model-parallel-size",
        "1",
        "--sequence-parallel",
        "--pipeline-model-parallel-size",
        "1",
        "--context-parallel-size",
        "1",
        "--expert-model-parallel-size",
        "1",
        "--expert-tensor-parallel-size",
        "1",
        "--use-dynamic-batch-size",
        "--max-tokens-per-gpu",
        "4096",
        "--rollout-num-gpus-per-engine",
        "1",
        "--sglang-mem-fraction-static",
        "0.55",
        "--attention-dropout",
        "0.0",
        "--hidden-dropout",
        "0.0",
        "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32",
        "--attention-backend",
        "flash",
    ],
    # examples/fully_async/run-qwen3.5-9B-fully_async.sh (+ the MODEL_ARGS of the scripts/models/*.sh it sources)
    "fully_async_qwen3.5": [
        "--actor-num-nodes",
        "1",
        "--actor-num-gpus-per-node",
        "4",
        "--rollout-num-gpus",
        "4",
        "--spec",
        "slime_plugins.models.qwen3_5",
        "get_qwen3_5_spec",
        "--disable-bias-linear",
        "--qk-layernorm",
        "--group-query-attention",
        "--num-attention-heads",
        "16",
        "--num-query-groups",
        "4",
        "--kv-channels",
        "256",
        "--num-layers",
        "32",
        "--hidden-size",
        "4096",
        "--ffn-hidden-size",
        "12288",
        "--use-gated-attention",
        "--normalization",
        "RMSNorm",
        "--apply-layernorm-1p",
        "--position-embedding-type",
        "rope",
        "--norm-epsilon",
        "1e-6",
        "--rotary-percent",
        "0.25",
        "--swiglu",
        "--untie-embeddings-and-output-weights",
        "--vocab-size",
        "248320",
        "--rotary-base",
        "10000000",
        "--attention-output-gate",
        "--hf-checkpoint",
        "/root/models/Qwen3.5-9B",
        "--ref-load",
        "/root/models/Qwen3.5-9B_torch_dist",
        "--save",
        "/tmp/slime_fully_async_demo/",
        "--save-interval",
        "9999",
        "--rollout-function-path",
        "slime.rollout.fully_async_rollout.generate_rollout_fully_async",
        "--prompt-data",
        "/root/datasets/dapo-math-17k/dapo-math-17k.jsonl",
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rollout-shuffle",
        "--rm-type",
        "deepscaler",
        "--num-rollout",
        "3",
        "--rollout-batch-size",
        "8",
        "--n-samples-per-prompt",
        "4",
        "--rollout-max-response-len",
        "2048",
        "--rollout-temperature",
        "1",
        "--global-batch-size",
        "32",
        "--balance-data",
        "--optimizer",
        "adam",
        "--lr",
        "1e-6",
        "--lr-decay-style",
        "constant",
        "--weight-decay",
        "0.1",
        "--adam-beta1",
        "0.9",
        "--adam-beta2",
        "0.98",
        "--advantage-estimator",
        "grpo",
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.00",
        "--kl-loss-type",
        "low_var_kl",
        "--entropy-coef",
        "0.00",
        "--eps-clip",
        "0.2",
        "--eps-clip-high",
        "0.28",
        "--tensor-model-parallel-size",
        "2",
        "--sequence-parallel",
        "--pipeline-model-parallel-size",
        "1",
        "--context-parallel-size",
        "1",
        "--expert-model-parallel-size",
        "1",
        "--expert-tensor-parallel-size",
        "1",
        "--recompute-granularity",
        "full",
        "--recompute-method",
        "uniform",
        "--recompute-num-layers",
        "1",
        "--use-dynamic-batch-size",
        "--max-tokens-per-gpu",
        "4096",
        "--rollout-num-gpus-per-engine",
        "2",
        "--sglang-mem-fraction-static",
        "0.7",
        "--attention-dropout",
        "0.0",
        "--hidden-dropout",
        "0.0",
        "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32",
        "--attention-backend",
        "flash",
    ],
}

# Where this service deliberately keeps its own default (see slime/cli/args.py and observability/flags.py).
OUR_DEFAULTS = {
    "rollout_batch_size": 4,  # required in slime
    "rollout_max_response_len": 64,  # None in slime (until the context ends); the embedded engine needs a bound
    "wandb_mode": "offline",  # None in slime (= online); no network unless asked
    "wandb_project": "slime",
}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def data(tmp_path) -> Path:
    return write_jsonl(tmp_path / "d.jsonl", [{"input": f"q{i}", "label": str(i)} for i in range(10)])


def base(data: Path) -> list[str]:
    return ["--rollout-backend", "hf", "--prompt-data", str(data)]


# ---------------------------------------------------------------- every flag


def test_every_slime_flag_has_slimes_default():
    parser = build_parser()
    raw, unknown = parser.parse_known_args([])
    assert unknown == []
    wrong = {}
    for flag, dest, kind, default, _ in SLIME_FLAGS:
        assert hasattr(raw, dest), f"{flag}: no args.{dest}"
        expected = OUR_DEFAULTS.get(dest, default)
        if getattr(raw, dest) != expected:
            wrong[flag] = (getattr(raw, dest), expected)
    assert wrong == {}


def _sample(kind: str, choices: list | None) -> tuple[list[str], object]:
    """(values to put after the flag, what args should hold)."""
    one = {"int": ("3", 3), "float": ("0.5", 0.5), "json": ('{"a": 1}', {"a": 1})}
    base_kind = kind.rstrip("+")
    text, value = one.get(base_kind, (None, None))
    if text is None:
        text = value = str(choices[0]) if choices else "x"
        if choices and isinstance(choices[0], int):
            value = choices[0]
    if kind.endswith("+"):
        return [text, text], [value, value]
    return [text], value


@pytest.mark.parametrize("flag,dest,kind,default,choices", SLIME_FLAGS, ids=[f[0] for f in SLIME_FLAGS])
def test_every_slime_flag_parses(flag, dest, kind, default, choices):
    parser = build_parser()
    if kind in ("store_true", "store_false"):
        argv, expected = [flag], kind == "store_true"
    elif kind == "boolean_optional":
        ns, unknown = parser.parse_known_args(["--no-" + flag[2:]])
        assert unknown == [] and getattr(ns, dest) is False
        argv, expected = [flag], True
    elif kind == "append":
        argv, expected = [flag, "a.b", flag, "c.d"], ["a.b", "c.d"]
    else:
        values, expected = _sample(kind, choices)
        argv = [flag, *values]
    ns, unknown = parser.parse_known_args(argv)
    assert unknown == []
    assert getattr(ns, dest) == expected


@pytest.mark.parametrize("name", sorted(RUN_SCRIPTS))
def test_slime_run_scripts_parse_whole(name, tmp_path, data):
    """Megatron flags, slime's flags and --sglang-* in one list: stored, not rejected."""
    argv = list(RUN_SCRIPTS[name])
    model = tmp_path / "hf"
    model.mkdir()
    for flag, value in (("--hf-checkpoint", str(model)), ("--prompt-data", str(data))):
        argv[argv.index(flag) + 1] = value
    if "--eval-prompt-data" in argv:
        argv[argv.index("--eval-prompt-data") + 2] = str(data)
    args = parse_args(["--rollout-backend", "hf", *argv])
    assert args.balance_data is True and args.use_dynamic_batch_size is True
    assert args.context_parallel_size == 1 and args.max_tokens_per_gpu in (4096, 9216, 20480)
    assert args.use_kl_loss is True and args.kl_loss_type == "low_var_kl" and args.eps_clip_high == 0.28
    assert args.optimizer == "adam" and args.lr == 1e-6 and args.adam_beta2 == 0.98
    assert args.sequence_parallel is True and args.accumulate_allreduce_grads_in_fp32 is True
    assert args.attention_dropout == 0.0 and args.attention_backend == "flash"
    assert args.sglang_mem_fraction_static in (0.55, 0.7)
    assert args.apply_chat_template is True and args.rollout_shuffle is True
    if "--colocate" in argv:  # slime: colocate offloads both sides
        assert args.colocate and args.offload_train and args.offload_rollout and args.offload
    if name == "multi_agent":
        assert args.moe_layer_freq == [1] * 48  # Megatron's moe_freq_type: a per-layer list
        assert args.sglang_extra_args["cuda_graph_bs"] == [str(b) for b in [1, 2, 4] + list(range(8, 257, 8))]
        assert args.sglang_cuda_graph_bs[:3] == [1, 2, 4]
        assert args.rollout_max_prompt_len == 16383 and args.eval_max_context_len == 16384
    if name == "fully_async_qwen3.5":
        assert args.spec == ["slime_plugins.models.qwen3_5", "get_qwen3_5_spec"]
        assert args.use_gated_attention is True  # added by slime's docker patch to Megatron
    if name == "retool":
        assert args.eval_datasets == [("aime", str(data))] and args.eval_datasets[0].n_samples_per_eval_prompt == 16
        assert args.wandb_key == "KEY" and args.reward_key == args.eval_reward_key == "score"


def test_trainer_defaults_are_megatrons_or_slimes(data):
    args = parse_args(base(data))
    assert (args.micro_batch_size, args.context_parallel_size, args.tensor_model_parallel_size) == (1, 1, 1)
    assert args.max_tokens_per_gpu is None and args.use_dynamic_batch_size is False
    assert args.loss_mask_type == "qwen" and args.colocate is False
    assert args.seed == 1234 and args.lr == 1e-6 and args.clip_grad == 1.0  # slime's reset_arg defaults
    assert args.distributed_backend == "nccl" and args.distributed_timeout_minutes == 10
    assert args.rollout_global_dataset is True and args.data_source_path.endswith("RolloutDataSourceWithBuffer")
    assert args.apply_chat_template_kwargs == {} and args.multimodal_keys is None and args.tool_key == "tools"
    assert parse_args(base(data) + ["--disable-rollout-global-dataset"]).rollout_global_dataset is False


def test_unknown_flag_is_an_error_naming_it(data, capsys):
    with pytest.raises(SystemExit):
        parse_args(base(data) + ["--no-such-flag", "1"])
    err = capsys.readouterr().err
    assert "unrecognized argument: --no-such-flag" in err
    with pytest.raises(SystemExit):
        parse_args(base(data) + ["--rollout-batch-sizes", "2"])  # no abbreviation or prefix matching
    assert "did you mean --rollout-batch-size" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(base(data) + ["--micro-batch-size", "many"])
    assert "--micro-batch-size: invalid int value: 'many'" in capsys.readouterr().err


def test_upstream_dests_mirror_ours(data):
    args = parse_args(base(data) + ["--disable-rewards-normalization", "--n-samples-per-prompt", "4"])
    assert args.rewards_normalization is False and args.disable_rewards_normalization is True
    assert args.grpo_std_normalization is True and args.disable_grpo_std_normalization is False
    one = parse_args(base(data))  # slime: one sample per prompt has no std to normalize by
    assert one.n_samples_per_prompt == 1 and one.grpo_std_normalization is False
    assert one.disable_grpo_std_normalization is True


def test_sglang_passthrough_keeps_working(data):
    args = parse_args(
        base(data)
        + [
            "--sglang-attention-backend",
            "triton",
            "--sglang-enable-metrics",
            "--sglang-max-running-requests=64",
            "--sglang-mem-fraction-static",
            "0.5",
        ]
    )
    assert args.sglang_extra_args == {
        "attention_backend": "triton",
        "enable_metrics": True,
        "max_running_requests": "64",
    }
    assert args.sglang_max_running_requests == 64 and args.sglang_attention_backend == "triton"
    assert args.sglang_mem_fraction_static == 0.5  # defined here, not passed through


def test_router_flags_are_sglang_routers(data):
    args = parse_args(base(data) + ["--router-balance-abs-threshold", "5"])
    assert args.router_balance_abs_threshold == 5 and args.router_log_level == "warn"
    assert args.router_balance_rel_threshold == 1.2


def test_validation_names_the_flag(data, tmp_path):
    cases = [
        (["--use-dynamic-batch-size"], "--use-dynamic-batch-size: needs --max-tokens-per-gpu"),
        (["--use-opd"], "--opd-type"),
        (["--save-interval", "5"], "--save-interval: needs --save"),
        (["--eval-interval", "5"], "--eval-interval: needs --eval-prompt-data or --eval-config"),
        (["--advantage-estimator", "reinforce_plus_plus"], "--normalize-advantages"),
        (["--rollout-max-context-len", "10", "--rollout-max-prompt-len", "10"], "--rollout-max-prompt-len"),
        (["--apply-chat-template-kwargs", "[1, 2]"], "--apply-chat-template-kwargs: must be a JSON object"),
        (["--multimodal-keys", '"image"'], "--multimodal-keys"),
        (["--num-epoch", "1", "--disable-rollout-global-dataset"], "--num-epoch"),
    ]
    for argv, msg in cases:
        with pytest.raises(ArgError, match=msg.replace("[", r"\[")):
            parse_args(base(data) + argv)


def test_num_epoch_sets_num_rollout(data):
    args = parse_args(base(data) + ["--num-epoch", "3", "--rollout-batch-size", "4"])
    assert args.num_rollout == 3 * 10 // 4
    assert parse_args(base(data) + ["--num-epoch", "3", "--num-rollout", "2"]).num_rollout == 2
    assert parse_args(base(data)).num_rollout == 1 and parse_args(base(data)).start_rollout_id == 0


def test_finalize_fills_a_hand_built_namespace(data):
    import argparse

    args = finalize_args(argparse.Namespace(rollout_backend="hf", prompt_data=str(data), rollout_batch_size=2))
    assert args.global_batch_size == 2 and args.micro_batch_size == 1 and args.apply_chat_template_kwargs == {}


# ---------------------------------------------------------------- rm type check


def test_rm_type_is_checked_at_startup(data, monkeypatch):
    import slime.rollout

    def check_rm_type(rm_type):
        if rm_type != "math":
            raise ValueError(f"unknown rm type {rm_type!r}")

    hub = types.ModuleType("slime.rollout.rm_hub")
    hub.check_rm_type = check_rm_type
    monkeypatch.setitem(sys.modules, "slime.rollout.rm_hub", hub)
    monkeypatch.setattr(slime.rollout, "rm_hub", hub, raising=False)
    assert parse_args(base(data) + ["--rm-type", "math"]).rm_type == "math"
    with pytest.raises(ArgError, match=r"--rm-type: unknown rm type 'nope'"):
        parse_args(base(data) + ["--rm-type", "nope"])
    cfg = data.parent / "eval.yaml"
    cfg.write_text(f"datasets:\n  - {{name: aime, path: {data}, rm_type: nope}}\n")
    with pytest.raises(ArgError, match=r"--eval-config: dataset 'aime': --rm-type: unknown rm type 'nope'"):
        parse_args(base(data) + ["--rm-type", "math", "--eval-config", str(cfg)])


def test_rm_type_check_of_the_real_hub(data):
    rm_hub = pytest.importorskip("slime.rollout.rm_hub")
    if not hasattr(rm_hub, "check_rm_type"):
        pytest.skip("slime.rollout.rm_hub has no check_rm_type yet")
    assert parse_args(base(data) + ["--rm-type", "deepscaler"]).rm_type == "deepscaler"
    with pytest.raises(ArgError, match="--rm-type 'no_such_rule'"):
        parse_args(base(data) + ["--rm-type", "no_such_rule"])


# ---------------------------------------------------------------- path@[start:end]


def test_parse_path_slice():
    assert parse_path_slice("/a/b.jsonl@[3:7]") == ("/a/b.jsonl", slice(3, 7))
    assert parse_path_slice("/a/b.jsonl@[-100:]") == ("/a/b.jsonl", slice(-100, None))
    assert parse_path_slice("/a/b.jsonl@[:-2]") == ("/a/b.jsonl", slice(None, -2))
    assert parse_path_slice("/a/b@x.jsonl") == ("/a/b@x.jsonl", None)
    assert parse_path_slice(Path("/a/b.parquet")) == ("/a/b.parquet", None)


def test_eval_prompt_data_slice(data):
    args = parse_args(base(data) + ["--eval-prompt-data", "aime", f"{data}@[0:3]", "last", f"{data}@[-2:]"])
    aime, last = args.eval_datasets
    assert aime == ("aime", f"{data}@[0:3]") and (aime.name, aime.file_path, aime.row_slice) == (
        "aime",
        str(data),
        slice(0, 3),
    )
    assert args.eval_prompt_data == ["aime", f"{data}@[0:3]", "last", f"{data}@[-2:]"]
    prompts, _ = build_prompt_samples(args, aime.path, "input", "label")
    assert [p.prompt for p in prompts] == ["q0", "q1", "q2"]
    prompts, _ = build_prompt_samples(args, last.path, "input", "label")
    assert [(p.prompt, p.label) for p in prompts] == [("q8", "8"), ("q9", "9")]


def test_prompt_data_slice_and_errors(data, tmp_path):
    args = parse_args(["--rollout-backend", "hf", "--prompt-data", f"{data}@[2:4]"])
    prompts, _ = build_prompt_samples(args, args.prompt_data, "input", None)
    assert [p.prompt for p in prompts] == ["q2", "q3"]
    with pytest.raises(DataError, match=r"selects no rows \(the file has 10\)"):
        build_prompt_samples(args, f"{data}@[20:30]", "input", None)
    with pytest.raises(ArgError, match=r"--eval-prompt-data: aime: file not found: .*missing\.jsonl$"):
        parse_args(base(data) + ["--eval-prompt-data", "aime", f"{tmp_path}/missing.jsonl@[0:3000]"])
    with pytest.raises(ArgError, match="--prompt-data: file not found"):
        parse_args(["--rollout-backend", "hf", "--prompt-data", f"{tmp_path}/none.jsonl@[0:2]"])


def test_single_eval_path_is_aime(data):  # upstream's legacy form
    assert parse_args(base(data) + ["--eval-prompt-data", str(data)]).eval_datasets == [("aime", str(data))]


# ---------------------------------------------------------------- --eval-config


def test_eval_config_resolution(data, tmp_path):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"""
eval:
  defaults:
    max_response_len: 100
    top_p: 0.7
    rm_type: math
  datasets:
    - name: aime
      path: {data}@[0:2]
      n_samples_per_eval_prompt: 4
      top_p: 0.9
      metadata_overrides: {{difficulty: hard}}
    - name: gsm
      path: {data}
      rm_type: gsm8k
      input_key: question
""")
    args = parse_args(
        base(data)
        + [
            "--eval-config",
            str(cfg),
            "--eval-prompt-data",
            "ignored",
            str(data),
            "--eval-temperature",
            "0.3",
            "--rollout-top-k",
            "5",
            "--n-samples-per-eval-prompt",
            "2",
            "--eval-interval",
            "1",
        ]
    )
    aime, gsm = args.eval_datasets
    assert aime == ("aime", f"{data}@[0:2]") and gsm == ("gsm", str(data))
    assert (aime.top_p, gsm.top_p) == (0.9, 0.7)  # dataset > defaults
    assert aime.max_response_len == gsm.max_response_len == 100
    assert aime.temperature == gsm.temperature == 0.3  # --eval-temperature
    assert aime.top_k == 5  # --rollout-top-k (no --eval-top-k)
    assert (aime.n_samples_per_eval_prompt, gsm.n_samples_per_eval_prompt) == (4, 2)
    assert (aime.rm_type, gsm.rm_type) == ("math", "gsm8k")
    assert (aime.input_key, gsm.input_key) == ("input", "question")
    assert aime.inject_metadata({"x": 1}) == {"x": 1, "rm_type": "math", "difficulty": "hard"}
    assert args.eval_prompt_data == ["aime", f"{data}@[0:2]", "gsm", str(data)]
    clone = pickle.loads(pickle.dumps(aime))  # crosses Ray
    assert clone == aime and clone.top_p == 0.9 and type(clone) is EvalDatasetConfig


def test_eval_config_mapping_form_and_errors(data, tmp_path):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"datasets:\n  aime: {{path: {data}, temperature: 0.6}}\n")
    (d,) = parse_args(base(data) + ["--eval-config", str(cfg)]).eval_datasets
    assert (d.name, d.path, d.temperature) == ("aime", str(data), 0.6)
    bad = [
        ("datasets:\n  - {name: a, path: %s, tempreture: 1}\n" % data, r"unknown field\(s\) \['tempreture'\]"),
        ("eval:\n  defaults: {nope: 1}\n  datasets: [{name: a, path: %s}]\n" % data, r"eval.defaults: \['nope'\]"),
        ("eval:\n  datasets: []\n", "no datasets"),
        ("datasets:\n  - {path: x.jsonl}\n", "`name`"),
        ("- 1\n", "root must be a mapping"),
        ("datasets:\n  - {name: a, path: %s/missing.jsonl}\n" % tmp_path, "--eval-config: a: file not found"),
    ]
    for text, msg in bad:
        cfg.write_text(text)
        with pytest.raises(ArgError, match=msg):
            parse_args(base(data) + ["--eval-config", str(cfg)])
    with pytest.raises(ArgError, match="--eval-config .*file not found"):
        parse_args(base(data) + ["--eval-config", str(tmp_path / "none.yaml")])


# ---------------------------------------------------------------- --custom-config-path


def test_custom_config_path_overrides_args(data, tmp_path):
    cfg = tmp_path / "custom.yaml"
    cfg.write_text("rollout_temperature: 0.25\nn_samples_per_prompt: 3\nmy_plugin_threshold: 0.9\ntis_mode: [a, b]\n")
    args = parse_args(base(data) + ["--custom-config-path", str(cfg), "--rollout-temperature", "0.8"])
    assert args.rollout_temperature == 0.25 and args.my_plugin_threshold == 0.9 and args.tis_mode == ["a", "b"]
    assert args.n_samples_per_prompt == 3 and args.global_batch_size == 4 * 3  # derived after the override
    cfg.write_text("- not a mapping\n")
    with pytest.raises(ArgError, match="--custom-config-path .*must be a mapping"):
        parse_args(base(data) + ["--custom-config-path", str(cfg)])
    cfg.write_text("a: [unclosed\n")
    with pytest.raises(ArgError, match="--custom-config-path .*invalid YAML"):
        parse_args(base(data) + ["--custom-config-path", str(cfg)])
    with pytest.raises(ArgError, match="--custom-config-path: file not found"):
        parse_args(base(data) + ["--custom-config-path", str(tmp_path / "none.yaml")])


# ---------------------------------------------------------------- --apply-chat-template-kwargs, --tool-key


class RecordingTokenizer:
    """Test double: renders messages as text and records the template arguments."""

    def __init__(self):
        self.calls: list[dict] = []

    def apply_chat_template(self, messages, **kwargs):
        self.calls.append(kwargs)
        return "|".join(m["content"] for m in messages) + ("<think>" if kwargs.get("enable_thinking") else "")

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(range(len(text.split("|"))))}


def test_apply_chat_template_kwargs_and_tools_reach_the_template(tmp_path):
    tools = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    rows = [
        {"messages": [{"role": "user", "content": "hi"}], "tools": tools},
        {"messages": [{"role": "user", "content": "yo"}], "tools": json.dumps(tools)},
        {"messages": [{"role": "user", "content": "no tools"}]},
    ]
    data = write_jsonl(tmp_path / "m.jsonl", rows)
    args = parse_args(
        [
            "--rollout-backend",
            "hf",
            "--prompt-data",
            str(data),
            "--input-key",
            "messages",
            "--apply-chat-template",
            "--apply-chat-template-kwargs",
            '{"enable_thinking": true}',
        ]
    )
    assert args.apply_chat_template_kwargs == {"enable_thinking": True}
    tok = RecordingTokenizer()
    prompts, _ = build_prompt_samples(args, data, "messages", None, tok)
    assert [p.prompt for p in prompts] == ["hi<think>", "yo<think>", "no tools<think>"]
    assert tok.calls == [
        {"tools": tools, "tokenize": False, "add_generation_prompt": True, "enable_thinking": True},
        {"tools": tools, "tokenize": False, "add_generation_prompt": True, "enable_thinking": True},
        {"tools": None, "tokenize": False, "add_generation_prompt": True, "enable_thinking": True},
    ]
    assert prompts[0].metadata["tools"] == tools and "tools" not in prompts[2].metadata


def test_bad_apply_chat_template_kwargs_json(data, capsys):
    with pytest.raises(SystemExit):
        parse_args(base(data) + ["--apply-chat-template-kwargs", "{enable_thinking: true}"])
    err = capsys.readouterr().err
    assert "argument --apply-chat-template-kwargs: invalid JSON '{enable_thinking: true}'" in err
    assert len(err.splitlines()) == 2  # a one-line usage, then the error


# ---------------------------------------------------------------- the generated flag table


def test_flag_table_matches_upstream_sources(tmp_path):
    """tools/gen_trainer_flags.py regenerates slime/cli/upstream_flags.json byte for byte."""
    mirrors = [Path("/work/.mirror/THUDM+slime/repo"), Path("/work/.mirror/NVIDIA+Megatron-LM/repo")]
    if not all(m.is_dir() for m in mirrors):
        pytest.skip("upstream mirrors not present")
    committed = json.loads((ROOT / "slime/cli/upstream_flags.json").read_text())
    out = tmp_path / "flags.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools/gen_trainer_flags.py"),
            "--slime",
            str(mirrors[0]),
            "--slime-commit",
            committed["sources"]["THUDM/slime"],
            "--megatron",
            str(mirrors[1]),
            "--megatron-commit",
            committed["sources"]["NVIDIA/Megatron-LM"],
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert json.loads(out.read_text()) == committed
    assert len(committed["flags"]) > 800 and committed["unparsed"] == []
