"""Every upstream flag we say we act on (`ACTED_ON`) acts: changing it changes what the code computes.

The loss, advantage, reward-normalisation and optimizer flags are proven here on fixed tensors, parsed by
`slime-train`'s own parser (so a flag's spelling, its default and `finalize`'s derived values are the ones a
user gets); every other flag names the test file that changes it and observes the difference, and that file
must set it. A flag added to `ACTED_ON` without a proof fails `test_every_acted_on_flag_has_a_proof`."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from slime.cli.honest_flags import ACTED_ON
from slime.cli.train import parse_train_args
from slime.train.loss import LossConfigError, LossHooks, advantages_of_rollout, approx_kl, policy_loss, sample_reducer
from slime.train.flags import LossConfig, OptimizerConfig
from slime.train.optimizer import build_optimizer
from slime.rollout.train_data import normalize_group_rewards
from slime.utils.types import Sample

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = [3, 3]
MASKS = [torch.ones(3), torch.ones(3)]
# new/old probability ratios outside [0.8, 1.2] both ways; the second sample's advantage is negative, so the
# dual clip (--eps-clip-c) has a large ratio to bound
RATIOS = torch.tensor([1.5, 0.5, 1.0, 3.0, 0.5, 1.0])
OLD_LP = torch.log(torch.tensor([0.2, 0.3, 0.4, 0.1, 0.3, 0.5]))
LP = OLD_LP + torch.log(RATIOS)
REF_LP = OLD_LP - 0.3
ROLLOUT_LP = OLD_LP - torch.log(torch.tensor([2.5, 0.5, 1.0, 1.0, 1.2, 1.0]))  # TIS ratios 2.5 and 0.5 clip
ADVANTAGES = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0])
ENTROPY = torch.tensor([0.7, 0.6, 0.5, 0.4, 0.3, 0.2])


def loss_config(argv: list[str]) -> LossConfig:
    return LossConfig.from_args(parse_train_args(argv))


def optimizer_config(argv: list[str]) -> OptimizerConfig:
    return OptimizerConfig.from_args(parse_train_args(argv))


def loss_of(argv: list[str]) -> dict[str, float]:
    reduce = sample_reducer(LENGTHS, MASKS, torch.tensor([3.0, 3.0]))
    out = policy_loss(
        loss_config(argv),
        log_probs=LP,
        entropy=ENTROPY,
        old_log_probs=OLD_LP,
        advantages=ADVANTAGES,
        rollout_log_probs=ROLLOUT_LP,
        ref_log_probs=REF_LP,
        response_lengths=LENGTHS,
        loss_masks=MASKS,
        reduce=reduce,
        denominators=torch.tensor([3.0, 3.0]),
        total_lengths=[5, 5],
    )
    return {k: float(v) for k, v in out.metrics.items()}


LOSS_FLAGS = {  # dest: (the run it changes, the flags that change it)
    "eps_clip": ([], ["--eps-clip", "0.1"]),
    "eps_clip_high": ([], ["--eps-clip-high", "0.6"]),
    "eps_clip_c": ([], ["--eps-clip-c", "1.5"]),
    "entropy_coef": ([], ["--entropy-coef", "0.1"]),
    "use_kl_loss": (["--kl-loss-coef", "0.5"], ["--use-kl-loss"]),
    "kl_loss_coef": (["--use-kl-loss", "--kl-loss-coef", "0.1"], ["--kl-loss-coef", "0.5"]),
    "kl_loss_type": (["--use-kl-loss", "--kl-loss-coef", "0.5"], ["--kl-loss-type", "k2"]),
    "use_unbiased_kl": (["--use-kl-loss", "--kl-loss-coef", "0.5"], ["--use-unbiased-kl"]),
    "use_tis": ([], ["--use-tis"]),
    "tis_clip": (["--use-tis"], ["--tis-clip", "1.1"]),
    "tis_clip_low": (["--use-tis"], ["--tis-clip-low", "0.9"]),
}


@pytest.mark.parametrize("dest", sorted(LOSS_FLAGS))
def test_a_loss_flag_changes_the_loss(dest):
    base, change = LOSS_FLAGS[dest]
    before, after = loss_of(base), loss_of(base + change)
    assert getattr(parse_train_args(base + change), dest) != getattr(parse_train_args(base), dest)
    assert not math.isclose(before["loss"], after["loss"], rel_tol=1e-6), (dest, before, after)


def test_the_clip_range_is_slimes_formula():
    """eps 0.2: per token max(-r*A, -clip(r, 0.8, 1.2)*A); dual clip bounds the negative side at eps_c*|A|."""
    clipped = RATIOS.clamp(0.8, 1.2)
    per_token = torch.maximum(-RATIOS * ADVANTAGES, -clipped * ADVANTAGES)
    assert loss_of([])["pg_loss"] == pytest.approx(float(per_token[:3].mean() + per_token[3:].mean()), rel=1e-6)
    dual = torch.where(ADVANTAGES < 0, torch.minimum(-1.5 * ADVANTAGES, per_token), per_token)
    assert loss_of(["--eps-clip-c", "1.5"])["pg_loss"] == pytest.approx(
        float(dual[:3].mean() + dual[3:].mean()), rel=1e-6
    )


def advantages_of(argv: list[str]) -> list[list[float]]:
    args = parse_train_args(argv)
    config = LossConfig.from_args(args)
    kl = [approx_kl(o, r, config.kl_loss_type) for o, r in zip(OLD_LP.split(LENGTHS), REF_LP.split(LENGTHS))]
    rollout_data = {"rewards": [1.0, 0.0], "loss_masks": MASKS, "kl": kl, "response_lengths": LENGTHS}
    return [a.tolist() for a in advantages_of_rollout(config, LossHooks.of(config, args), rollout_data)]


ADVANTAGE_FLAGS = {
    "gamma": (["--advantage-estimator", "reinforce_plus_plus", "--normalize-advantages"], ["--gamma", "0.5"]),
    "kl_coef": (
        ["--advantage-estimator", "reinforce_plus_plus_baseline", "--normalize-advantages"],
        ["--kl-coef", "0.5"],
    ),
    "advantage_estimator": (
        ["--normalize-advantages", "--gamma", "0.5"],
        ["--advantage-estimator", "reinforce_plus_plus"],
    ),
    "custom_advantage_function_path": (
        [],
        ["--custom-advantage-function-path", "tests.plugins.loss_hooks.kl_shaped_advantage"],
    ),
}


@pytest.mark.parametrize("dest", sorted(ADVANTAGE_FLAGS))
def test_an_advantage_flag_changes_the_advantages(dest):
    base, change = ADVANTAGE_FLAGS[dest]
    assert advantages_of(base) != advantages_of(base + change)


def test_a_custom_advantage_function_replaces_the_estimator_and_a_wrong_shape_is_named():
    path = "tests.plugins.loss_hooks.kl_shaped_advantage"
    flat = [x for sample in advantages_of(["--custom-advantage-function-path", path]) for x in sample]
    assert flat == pytest.approx([1.0 - 2 * 0.3] * 3 + [-2 * 0.3] * 3)  # k1 KL of old vs ref: 0.3 per token
    with pytest.raises(LossConfigError, match="--custom-advantage-function-path .*one tensor per sample"):
        advantages_of(["--custom-advantage-function-path", "tests.plugins.loss_hooks.advantage_of_wrong_length"])


def rewards_of(argv: list[str]) -> list[float]:
    args = parse_train_args(["--n-samples-per-prompt", "4", *argv])
    samples = [Sample(index=i, group_index=0) for i in range(4)]
    return normalize_group_rewards(args, samples, [1.0, 0.0, 0.0, 1.0])


def test_reward_normalisation_flags_change_the_rewards():
    normalised, mean_only, raw = (
        rewards_of([]),
        rewards_of(["--disable-grpo-std-normalization"]),
        rewards_of(["--disable-rewards-normalization"]),
    )
    assert raw == [1.0, 0.0, 0.0, 1.0]
    assert mean_only == [0.5, -0.5, -0.5, 0.5]
    std = (4 * 0.25 / 3) ** 0.5  # the group's sample standard deviation
    assert normalised == pytest.approx([x / (std + 1e-6) for x in mean_only])


GRADIENTS = [torch.tensor([0.5, -0.25, 1e-9]), torch.tensor([-0.1, 0.4, 3e-9]), torch.tensor([0.3, 0.3, 0.0])]


def step_of(argv: list[str]) -> list[float]:
    """A three-weight model after AdamW steps on gradients that change (so both betas matter)."""
    weight = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3e-9]))
    optimizer, scheduler = build_optimizer([weight], optimizer_config(["--lr", "0.1", *argv]))
    for grad in GRADIENTS:
        optimizer.zero_grad()
        weight.grad = grad.clone()
        optimizer.step()
        scheduler.step()
    return weight.detach().tolist()


OPTIMIZER_FLAGS = {
    "lr": ["--lr", "0.01"],
    "adam_beta1": ["--adam-beta1", "0.5"],
    "adam_beta2": ["--adam-beta2", "0.5"],
    "adam_eps": ["--adam-eps", "1e-3"],
    "weight_decay": ["--weight-decay", "0.5"],
    "lr_warmup_iters": ["--lr-warmup-iters", "4"],
}


@pytest.mark.parametrize("dest", sorted(OPTIMIZER_FLAGS))
def test_an_optimizer_flag_changes_the_step(dest):
    assert step_of([]) != step_of(OPTIMIZER_FLAGS[dest])


def test_warm_up_scales_the_first_steps_learning_rate():
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer, scheduler = build_optimizer([weight], optimizer_config(["--lr", "0.1", "--lr-warmup-iters", "4"]))
    rates = []
    for _ in range(6):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1])


def test_normalize_advantages_whitens_over_the_masked_tokens_of_every_rank():
    from slime.train.loss import normalized_advantages

    advantages, masks = (
        [torch.tensor([1.0, 1.0, 5.0]), torch.tensor([-1.0, 0.0])],
        [torch.tensor([1.0, 1.0, 0.0]), torch.ones(2)],
    )
    assert normalized_advantages(loss_config([]), advantages, masks) is advantages
    out = torch.cat(normalized_advantages(loss_config(["--normalize-advantages"]), advantages, masks))
    kept = out[torch.cat(masks) > 0]
    assert float(kept.mean()) == pytest.approx(0.0, abs=1e-6) and float(kept.std(unbiased=False)) == pytest.approx(
        1.0, rel=1e-4
    )
    doubled = normalized_advantages(
        loss_config(["--normalize-advantages"]), advantages, masks, all_reduce=lambda stats: stats.mul_(2)
    )  # a second rank with the same tokens
    assert torch.allclose(torch.cat(doubled), out)


def test_eval_flags_reach_the_eval_requests_and_rewards():
    from slime.rollout.evaluation import eval_reward, eval_sampling_params
    from slime.rollout.flags import RolloutRunConfig

    data = ["--eval-prompt-data", "demo_eval", "configs/demo/eval.jsonl"]
    plain = parse_train_args(data)
    tuned = parse_train_args(
        [*data, "--eval-top-k", "5", "--eval-min-new-tokens", "3", "--eval-tool-key", "eval_tools"]
    )
    before, after = (
        eval_sampling_params(plain, plain.eval_datasets[0]),
        eval_sampling_params(tuned, tuned.eval_datasets[0]),
    )
    assert (after["top_k"], after["min_new_tokens"]) == (5, 3) and (
        before.get("top_k"),
        before.get("min_new_tokens"),
    ) != (5, 3)
    assert (plain.eval_datasets[0].tool_key, tuned.eval_datasets[0].tool_key) == ("tools", "eval_tools")
    sample = Sample(index=0, reward={"acc": 1.0, "format": 0.5})
    for key, reward in (("format", 0.5), ("acc", 1.0)):
        config = RolloutRunConfig.from_args(parse_train_args([*data, "--eval-reward-key", key]))
        assert eval_reward(config, sample) == reward


MODEL_SHAPE = [
    "--hidden-size",
    "16",
    "--num-attention-heads",
    "2",
    "--group-query-attention",
    "--num-query-groups",
    "2",
    "--vocab-size",
    "32",
    "--ffn-hidden-size",
    "64",
    "--num-layers",
    "4",
    "--kv-channels",
    "8",
]
MOE = ["--num-experts", "8", "--moe-ffn-hidden-size", "48", "--moe-router-topk", "2"]  # 96 wide, not 64
SHAPE_FLAGS = {  # forward FLOPs, the weight --balance-data balances ranks by (slime's cost model)
    "hidden_size": ["--hidden-size", "32"],
    "num_attention_heads": ["--num-attention-heads", "4"],
    "num_query_groups": ["--num-query-groups", "1"],
    "vocab_size": ["--vocab-size", "64"],
    "ffn_hidden_size": ["--ffn-hidden-size", "128"],
    "num_layers": ["--num-layers", "2"],
    "kv_channels": ["--kv-channels", "4"],
    "num_experts": MOE,
    "moe_ffn_hidden_size": [*MOE, "--moe-ffn-hidden-size", "40"],
    "moe_router_topk": [*MOE, "--moe-router-topk", "1"],
    "moe_layer_freq": [*MOE, "--moe-layer-freq", "2"],
    "moe_shared_expert_intermediate_size": [*MOE, "--moe-shared-expert-intermediate-size", "16"],
}


@pytest.mark.parametrize("dest", sorted(SHAPE_FLAGS))
def test_a_model_shape_flag_changes_the_flops_ranks_are_balanced_by(dest):
    from slime.train_batch.flops import FlopsModel

    base = MOE if dest.startswith("moe_") else []
    before = FlopsModel.from_args(parse_train_args([*MODEL_SHAPE, *base]))
    after = FlopsModel.from_args(parse_train_args([*MODEL_SHAPE, *SHAPE_FLAGS[dest]]))
    assert (before.linear, before.quadratic) != (after.linear, after.quadratic)


def test_the_moe_layer_frequency_is_megatrons_int_or_per_layer_list_never_evaluated_code():
    assert [parse_train_args(["--moe-layer-freq", v]).moe_layer_freq for v in ("2", "[1,0,1]", "([1]*3+[0]*1)")] == [
        2,
        [1, 0, 1],
        [1, 1, 1, 0],
    ]
    with pytest.raises(SystemExit):
        parse_train_args(["--moe-layer-freq", "__import__('os').getpid()"])


def test_derived_flags_set_what_slime_derives():
    """--balance-by-flops turns on --balance-data (whose effect tests/test_slime_parity.py shows),
    --num-steps-per-rollout sets the global batch, --dump-details the two debug dumps."""
    dynamic = ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "64"]
    assert not parse_train_args(dynamic).balance_data
    assert parse_train_args([*dynamic, "--balance-by-flops"]).balance_data
    steps = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4"]
    assert parse_train_args([*steps, "--num-steps-per-rollout", "4"]).global_batch_size == 4
    assert parse_train_args([*steps, "--num-steps-per-rollout", "2"]).global_batch_size == 8
    dumped = parse_train_args(["--dump-details", "/tmp/d"])
    assert (dumped.save_debug_rollout_data, dumped.save_debug_train_data) == (
        "/tmp/d/rollout_data/{rollout_id}.pt",
        "/tmp/d/train_data/{rollout_id}.pt",
    )


def test_flags_the_trainer_cannot_honour_are_refused_by_name():
    from slime.cli.validate import ArgError
    from slime.train.loss import check_loss_args

    with pytest.raises(ArgError, match="--optimizer: sgd"):
        parse_train_args(["--optimizer", "sgd"])
    with pytest.raises(LossConfigError, match="--calculate-per-token-loss"):
        check_loss_args(loss_config(["--calculate-per-token-loss"]))
    with pytest.raises(ArgError, match="--freeze-params-name-list: '\\(' is not a regular expression"):
        parse_train_args(["--freeze-params-name-list", "("])


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens, self.layer, self.lm_head = (
            torch.nn.Linear(2, 2),
            torch.nn.Linear(2, 2),
            torch.nn.Linear(2, 2),
        )


def test_freeze_and_only_train_choose_the_trained_parameters_by_regex():
    from slime.train.trainable import TrainableParamsError, apply_trainable_patterns

    assert len(apply_trainable_patterns(TwoLayers(), optimizer_config([]))) == 6
    assert apply_trainable_patterns(TwoLayers(), optimizer_config(["--only-train-params-name-list", "lm_head"])) == [
        "lm_head.weight",
        "lm_head.bias",
    ]
    model = TwoLayers()
    left = apply_trainable_patterns(model, optimizer_config(["--freeze-params-name-list", "^embed", r"\.bias$"]))
    assert left == ["layer.weight", "lm_head.weight"]
    assert [p.requires_grad for p in model.embed_tokens.parameters()] == [False, False]
    with pytest.raises(TrainableParamsError, match="--freeze-params-name-list 'self_attention' matches no param"):
        apply_trainable_patterns(TwoLayers(), optimizer_config(["--freeze-params-name-list", "self_attention"]))


def test_colocated_engines_take_the_actors_gpus(tmp_path):
    """slime: with --colocate the rollout has the actors' GPUs, --actor-num-gpus-per-node x --actor-num-nodes."""
    colocated = [
        "--colocate",
        "--rollout-backend",
        "sglang",
        "--hf-checkpoint",
        str(tmp_path),
        "--rollout-num-gpus-per-engine",
        "2",
    ]
    gpus = {
        argv: (a.rollout_num_gpus, a.rollout_num_engines)
        for argv, a in (
            (tag, parse_train_args([*colocated, *extra]))
            for tag, extra in (
                ("base", []),
                ("per_node", ["--actor-num-gpus-per-node", "4"]),
                ("nodes", ["--actor-num-gpus-per-node", "4", "--actor-num-nodes", "2"]),
            )
        )
    }
    assert gpus == {"base": (8, 4), "per_node": (4, 2), "nodes": (8, 4)}
    assert parse_train_args([*colocated, "--actor-num-nodes", "3"]).rollout_num_gpus == 24


def test_offload_rollout_makes_engines_release_memory_and_refuses_what_it_cannot_overlap(tmp_path):
    """--offload-rollout (alone, without --colocate): SGLang engines start able to release their memory
    (slime's --enable-memory-saver), the loop offloads them around training (tests/test_train_loop.py runs it
    colocated), so --async, which overlaps the two, is refused by name."""
    from slime.fleet.engine_server import sglang_server_args
    from slime.fleet.flags import EngineConfig

    def server_argv(extra: list[str]) -> list[str]:
        args = parse_train_args(
            ["--rollout-backend", "sglang", "--hf-checkpoint", str(tmp_path), "--rollout-num-gpus", "1", *extra]
        )
        return sglang_server_args(EngineConfig.from_args(args), host="127.0.0.1", port=1, base_gpu_id=0, tp_size=1)

    assert "--enable-memory-saver" not in server_argv([])
    assert "--enable-memory-saver" in server_argv(["--offload-rollout"])
    from slime.cli.validate import ArgError

    assert parse_train_args(["--async"]).async_train
    with pytest.raises(ArgError, match="drop --offload-rollout or --async"):
        parse_train_args(["--async", "--offload-rollout"])


def test_flags_not_acted_on_are_named_at_start_up(tmp_path):
    """--sglang-config is slime's deployment YAML, not SGLang's --config: not passed to the engines, named."""
    from slime.cli.honest_flags import unused_flags_line
    from slime.cli.parser import build_parser
    from slime.fleet.engine_server import sglang_server_args
    from slime.fleet.flags import EngineConfig

    argv = [
        "--rollout-backend",
        "sglang",
        "--hf-checkpoint",
        str(tmp_path),
        "--rollout-num-gpus",
        "1",
        "--sglang-config",
        "deploy.yaml",
        "--trust-remote-code",
        "--num-workers",
        "4",
    ]
    args = parse_train_args(argv)
    config = EngineConfig.from_args(args)
    assert "--config" not in sglang_server_args(config, host="127.0.0.1", port=1, base_gpu_id=0, tp_size=1)
    parser = build_parser()
    line = unused_flags_line(parser, parser.parse_args(argv))
    assert all(flag in line for flag in ("--sglang-config", "--trust-remote-code", "--num-workers")), line


# flags whose effect needs a model, a fleet or a run: the test file that changes each and observes the difference
PROVEN_IN = {
    "apply_chat_template_kwargs": "tests/test_prompt_data.py",
    "balance_data": "tests/test_slime_parity.py",
    "buffer_filter_path": "tests/test_rollout_scripted.py",
    "check_weight_update_equal": "tests/test_train_loop.py",
    "ckpt_step": "tests/test_train_loop.py",
    "colocate": "tests/test_train_loop.py",
    "custom_config_path": "tests/test_slime_recipes.py",
    "custom_convert_samples_to_train_data_path": "tests/test_train_data.py",
    "custom_loss_function_path": "tests/test_loss_hooks.py",
    "custom_pg_loss_reducer_function_path": "tests/test_loss_hooks.py",
    "loss_type": "tests/test_loss_hooks.py",
    "rollout_data_postprocess_path": "tests/test_loss_hooks.py",
    "custom_reward_post_process_path": "tests/test_train_data.py",
    "custom_rollout_log_function_path": "tests/test_rollout_scripted.py",
    "custom_tis_function_path": "tests/test_slime_recipes.py",
    "get_mismatch_metrics": "tests/test_slime_recipes.py",
    "data_source_path": "tests/test_rollout_scripted.py",
    "eval_config": "tests/test_slime_parity.py",
    "loss_mask_type": "tests/test_sft_rollout.py",
    "max_tokens_per_gpu": "tests/test_train_schedule.py",
    "use_dynamic_batch_size": "tests/test_train_schedule.py",
    "micro_batch_size": "tests/test_train_schedule.py",
    "microbatch_group_size_per_vp_stage": "tests/test_train_schedule.py",
    "opd_kl_coef": "tests/test_opd.py",
    "opd_type": "tests/test_opd.py",
    "use_opd": "tests/test_opd.py",
    "rm_url": "tests/test_rm_hub.py",
    "rollout_all_samples_process_path": "tests/test_rollout_scripted.py",
    "rollout_sample_filter_path": "tests/test_rollout_scripted.py",
    "rollout_sample_hook_path": "tests/test_rollout_scripted.py",
    "rollout_external_engine_addrs": "tests/test_external_engines.py",
    "rollout_global_dataset": "tests/test_sft_rollout.py",
    "save_interval": "tests/test_train_loop.py",
    "update_weight_buffer_size": "tests/test_push_faults.py",
    "update_weights_interval": "tests/test_train_weights_interval.py",
    "num_epoch": "tests/test_args_compat.py",
    "custom_eval_rollout_log_function_path": "tests/test_rollout_scripted.py",
    **{
        dest: "tests/test_trainer_flag_effects.py"
        for dest in ("clip_grad", "seed", "use_rollout_logprobs", "ref_load", "no_save_optim", "no_load_optim")
    },
}
# acted on, with no test yet that changes them and sees the difference (this list only shrinks)
TO_PROVE: set[str] = set()


def proven_here() -> set[str]:
    return {
        *LOSS_FLAGS,
        *ADVANTAGE_FLAGS,
        *OPTIMIZER_FLAGS,
        *SHAPE_FLAGS,
        "rewards_normalization",
        "grpo_std_normalization",
        "balance_by_flops",
        "num_steps_per_rollout",
        "dump_details",
        "optimizer",
        "calculate_per_token_loss",
        "freeze_params_name_list",
        "only_train_params_name_list",
        "normalize_advantages",
        "eval_top_k",
        "eval_min_new_tokens",
        "eval_tool_key",
        "eval_reward_key",
        "actor_num_gpus_per_node",
        "actor_num_nodes",
        "offload_rollout",
    }


def test_every_acted_on_flag_has_a_proof():
    assert sorted(ACTED_ON - proven_here() - set(PROVEN_IN) - TO_PROVE) == []
    assert sorted((proven_here() | set(PROVEN_IN) | TO_PROVE) - ACTED_ON) == []  # nothing proven that is not claimed
    assert not (TO_PROVE & (proven_here() | set(PROVEN_IN)))


@pytest.mark.parametrize("dest", sorted(PROVEN_IN))
def test_the_named_test_file_sets_the_flag(dest):
    text = (ROOT / PROVEN_IN[dest]).read_text()
    assert "--" + dest.replace("_", "-") in text or re.search(rf"\b{dest}\s*=", text), (dest, PROVEN_IN[dest])
