"""The metrics, metric logs and rollout dumps receive `ReportConfig` (issue #33), read once from the namespace by
their owner (the rollout controller, the rollout manager, the trainer's metrics sink); nothing in
`slime.observability` reads a flag off `args` but slime's own helpers that plugins call with it."""

from __future__ import annotations

from slime.cli.parser import build_parser
from slime.observability import metrics as M
from slime.observability.flags import ObservabilityConfig, ReportConfig
from slime.utils.types import Sample
from tests.args_reads import flag_reads

DESTS = {a.dest for a in build_parser()._actions if a.option_strings}  # noqa: SLF001

# slime's function signatures, called by slime's plugins with their `args`: they read it as slime's do
STILL_READ_FROM_ARGS = {
    "slime/observability/rollout_metrics.py": {"rollout_num_gpus"},  # compute_perf_metrics_from_samples(args, ...)
    # validate_rollout_routed_experts_for_replay(routed_experts, args): Megatron's model flags
    "slime/observability/rollout_data_utils.py": {"num_layers", "moe_router_topk", "moe_layer_freq"},
}


def test_the_report_config_of_an_empty_command_line_is_slimes_defaults():
    assert ReportConfig.from_args(build_parser().parse_args([])) == ReportConfig(
        observability=ObservabilityConfig(),
        rollout_batch_size=4,
        n_samples_per_prompt=1,
        global_batch_size=None,
        n_samples_per_eval_prompt=1,
        reward_key=None,
        hf_checkpoint=None,
    )


def test_the_flags_given_reach_the_metrics():
    argv = ["--reward-key", "acc", "--wandb-always-use-train-step", "--rollout-batch-size", "8"]
    argv += ["--n-samples-per-prompt", "4", "--global-batch-size", "16"]
    config = ReportConfig.from_args(build_parser().parse_args(argv))
    sample = Sample(reward={"acc": 1.0, "score": 0.0}, response_length=1, status=Sample.Status.COMPLETED)
    assert M.reward_value(config, sample) == 1.0  # --reward-key, read by slime's Sample.get_reward_value
    assert M.compute_rollout_metrics(config, 3, [sample])["rollout/reward_mean"] == 1.0
    assert M.log_step(config, 3) == 3 * 8 * 4 // 16


def test_observability_reads_no_flag_from_args_but_in_slimes_helpers():
    """metrics, reporting, metrics_log, rollout_dump and wandb_logger read configs (before: 20 reads of 18 flags in 5 files;
    wandb_logger's WandbRun.start/join take the namespace, which the run records, and read ObservabilityConfig
    from it once)."""
    assert flag_reads("slime/observability", DESTS) == STILL_READ_FROM_ARGS
