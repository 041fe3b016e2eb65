"""The reference trainer's flags reach `slime.train` as frozen, typed configs read once from the parsed namespace
(issue #33): slime's and Megatron's defaults, no fallback, and no flag read from `args` below the CLI."""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path

import pytest

from slime.cli.parser import build_parser
from slime.train.flags import LoopConfig, LossConfig, OptimizerConfig, TrainConfig, WorkerConfig

ROOT = Path(__file__).resolve().parents[1]

# slime's defaults (slime/utils/arguments.py), as upstream_flags.json registers them
SLIME_LOSS = LossConfig(
    advantage_estimator="grpo",
    loss_type="policy_loss",
    calculate_per_token_loss=False,
    normalize_advantages=False,
    gamma=1.0,
    kl_coef=0.0,
    use_kl_loss=False,
    kl_loss_coef=0.0,
    kl_loss_type="k1",
    use_unbiased_kl=False,
    eps_clip=0.2,
    eps_clip_high=None,
    eps_clip_c=None,
    entropy_coef=0.0,
    use_rollout_logprobs=False,
    use_tis=False,
    tis_clip=2.0,
    tis_clip_low=0,
    get_mismatch_metrics=False,
    use_opd=False,
    opd_type=None,
    opd_kl_coef=1.0,
    custom_loss_function_path=None,
    custom_advantage_function_path=None,
    custom_tis_function_path=None,
    custom_pg_loss_reducer_function_path=None,
    rollout_data_postprocess_path=None,
)
# Megatron-LM's (megatron/training/arguments.py) and slime's trainable-parameter patterns
MEGATRON_OPTIMIZER = OptimizerConfig(
    lr=1e-6,
    adam_beta1=0.9,
    adam_beta2=0.999,
    adam_eps=1e-8,
    weight_decay=0.01,
    lr_warmup_iters=0,
    clip_grad=1.0,
    only_train_params_name_list=None,
    freeze_params_name_list=None,
)


def test_the_loss_and_optimizer_configs_of_an_empty_command_line_are_slimes_and_megatrons_defaults():
    args = build_parser().parse_args([])
    assert LossConfig.from_args(args) == SLIME_LOSS
    assert OptimizerConfig.from_args(args) == MEGATRON_OPTIMIZER


def test_the_worker_and_loop_configs_are_read_from_one_namespace_with_their_parts():
    """From `slime-train`'s parse (finalize derives --eval-datasets and --num-rollout, which the loop reads)."""
    from slime.cli.train import parse_train_args

    args = parse_train_args(
        ["--eps-clip", "0.3", "--lr", "0.5", "--actor-num-workers", "2", "--update-weights-interval", "3"]
    )
    worker = WorkerConfig.from_args(args)
    assert worker.loss == dataclasses.replace(SLIME_LOSS, eps_clip=0.3, eps_clip_high=0.3)  # finalize: high = low
    assert worker.optimizer == dataclasses.replace(MEGATRON_OPTIMIZER, lr=0.5)
    assert worker.train == dataclasses.replace(TrainConfig(), actor_num_workers=2)
    assert (worker.seed, worker.update_weight_buffer_size, worker.rollout_temperature) == (1234, 512 * 1024**2, 1.0)
    loop = LoopConfig.from_args(args)
    assert loop.worker == worker and (loop.update_weights_interval, loop.num_rollout, loop.eval_datasets) == (3, 1, [])
    for config in (SLIME_LOSS, MEGATRON_OPTIMIZER, worker, loop):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(config, dataclasses.fields(config)[0].name, None)


def test_a_namespace_missing_a_flag_is_an_error_naming_it_not_a_second_default():
    args = vars(build_parser().parse_args([]))
    del args["tis_clip"]
    with pytest.raises(AttributeError, match="tis_clip"):
        WorkerConfig.from_args(argparse.Namespace(**args))


# what `slime.train` may still read from a namespace: nothing (the metrics sink reads --use-wandb off its
# ReportConfig, and hands the namespace only to wandb's setup, which records it as the run's config)
STILL_READ_FROM_ARGS: dict[str, set[str]] = {}


def flag_reads(root: Path = ROOT) -> dict[str, set[str]]:
    """file -> the flags `slime/train/*.py` reads as `<...>args.<flag>` (a namespace's attribute)."""
    dests = {a.dest for a in build_parser()._actions if a.option_strings}  # noqa: SLF001
    out: dict[str, set[str]] = {}
    for path in sorted((root / "slime" / "train").glob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Attribute) and node.attr in dests:
                owner = ast.unparse(node.value).split(".")[-1]
                if owner.endswith("args"):
                    out.setdefault(rel, set()).add(node.attr)
    return out


def test_the_trainer_reads_its_flags_from_its_configs_not_from_args():
    """loss.py, worker.py, loop.py, optimizer.py, trainable.py, actor_group.py and flags.py' checks read configs;
    the namespace reaches only slime's plugins (LossHooks), the rollout manager and observability."""
    assert flag_reads() == STILL_READ_FROM_ARGS


def test_the_scan_finds_a_flag_read_from_args(tmp_path):
    (tmp_path / "slime" / "train").mkdir(parents=True)
    (tmp_path / "slime" / "train" / "x.py").write_text(
        "def f(args, self, config):\n    return args.eps_clip, self.args.lr, config.gamma, args.not_a_flag\n"
    )
    assert flag_reads(tmp_path) == {"slime/train/x.py": {"eps_clip", "lr"}}


def test_a_plugin_the_config_names_but_the_hooks_lack_is_refused_not_replaced_by_the_built_in():
    """Plugins are resolved once into LossHooks (with the namespace they are given); a caller that passes the
    config without them gets an error naming the flag, not slime's estimator computed in the plugin's place."""
    import torch

    from slime.train.loss import LossConfigError, LossHooks, advantages_of_rollout

    path = "tests.plugins.loss_hooks.kl_shaped_advantage"
    args = build_parser().parse_args(["--custom-advantage-function-path", path])
    config = LossConfig.from_args(args)
    data = {"rewards": [1.0], "loss_masks": [torch.ones(2)], "kl": [torch.zeros(2)], "response_lengths": [2]}
    with pytest.raises(LossConfigError, match=f"--custom-advantage-function-path {path} is set but not resolved"):
        advantages_of_rollout(config, LossHooks(), dict(data))
    hooks = LossHooks.of(config, args)
    assert hooks.args is args and len(advantages_of_rollout(config, hooks, dict(data))) == 1
