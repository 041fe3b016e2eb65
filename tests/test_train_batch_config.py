"""The train-batch split reads its flags as one frozen `TrainBatchConfig` (issue #33), read once by the rollout
controller and handed to `split_for_data_parallel`; slime's `build_dp_schedule(args, ...)` reads the same config
from the namespace it is given. Nothing in `slime/train_batch`, `slime/utils` or `slime/engine` reads a flag off
`args` but the files named below, each with the reason it must."""

from __future__ import annotations

import argparse
import dataclasses
import pickle
from types import SimpleNamespace

import pytest

from slime.cli.parser import build_parser
from slime.train_batch.flags import ModelShape, TrainBatchConfig
from slime.train_batch.flops import FlopsModel
from slime.train_batch.rank_batches import schedule_for
from slime.utils.dp_schedule import build_dp_schedule
from slime.utils.plugin_args import completed
from tests.args_reads import flag_reads

# every flag of the parser, and the `--sglang-*` passthrough parse_args stores beside them
DESTS = {a.dest for a in build_parser()._actions if a.option_strings} | {"sglang_extra_args"}  # noqa: SLF001
PACKAGES = ("slime/train_batch", "slime/utils", "slime/engine")

# file -> why it reads `args.<flag>`: a signature of slime's that takes `args`, or the namespace's own completion
STILL_READ_FROM_ARGS = {
    "slime/utils/endpoints.py": "rollout_num_engines(args): slime's get_rollout_num_engines(args) "
    "(slime.utils.http_utils), by which slime's rollout functions size their concurrency",
    "slime/utils/eval_config.py": "resolve_eval_datasets(args): upstream's _resolve_eval_datasets, run by the "
    "CLI's finalize (slime.cli.finalize)",
    "slime/utils/plugin_args.py": "completed(args): a hand-built namespace completed with the parser's defaults",
    "slime/utils/types.py": "slime's Sample.get_reward_value(args) and its routed-experts decoding from the "
    "engine's meta info (args.num_layers, args.moe_router_topk)",
    "slime/engine/default_model.py": "resolve_hf_checkpoint(args): the namespace's finalize step where it enters "
    "(the commands, RolloutManager for slime's train.py), which writes the default model as args.hf_checkpoint "
    "for slime's plugins; the model's choice is default_hf_checkpoint(rollout_backend)",
}

# upstream slime's and Megatron-LM's defaults, as upstream_flags.json registers them
UPSTREAM_SHAPE = ModelShape(
    hidden_size=None,
    num_attention_heads=None,
    num_query_groups=1,
    group_query_attention=False,
    kv_channels=None,
    ffn_hidden_size=None,
    num_layers=None,
    vocab_size=None,
    num_experts=None,
    moe_layer_freq=1,
    moe_ffn_hidden_size=None,
    moe_router_topk=2,
    moe_shared_expert_intermediate_size=None,
    hf_checkpoint=None,
)
# tests/test_slime_parity.py's model (and slime's test_dp_schedule's), as flags
SHAPE = {"hidden_size": 16, "num_attention_heads": 2, "ffn_hidden_size": 64, "num_layers": 2, "vocab_size": 32}
SHAPE["kv_channels"] = 8
MODEL = [x for name, value in SHAPE.items() for x in ("--" + name.replace("_", "-"), str(value))]


def test_the_config_of_an_empty_command_line_is_the_parsers_defaults():
    args = build_parser().parse_args([])
    config = TrainBatchConfig.from_args(args)
    assert config == TrainBatchConfig(
        global_batch_size=None,
        micro_batch_size=1,
        use_dynamic_batch_size=False,
        max_tokens_per_gpu=None,
        balance_data=False,
        model=UPSTREAM_SHAPE,
    )
    assert TrainBatchConfig.from_args(completed(SimpleNamespace())) == config  # a namespace built by hand
    # every field is a parser flag with no default of its own: the parser's are the only ones
    for part in (config, config.model):
        for f in dataclasses.fields(part):
            if f.name != "model":
                assert f.name in DESTS and f.default is dataclasses.MISSING, f.name
                assert getattr(part, f.name) == getattr(args, f.name), f.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.balance_data = True  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(config)) == config


def test_the_flags_given_reach_the_config():
    argv = ["--global-batch-size", "8", "--micro-batch-size", "2", "--use-dynamic-batch-size"]
    argv += ["--max-tokens-per-gpu", "100", "--balance-data", "--hf-checkpoint", "/m", *MODEL]
    config = TrainBatchConfig.from_args(build_parser().parse_args(argv))
    assert (config.global_batch_size, config.micro_batch_size, config.max_tokens_per_gpu) == (8, 2, 100)
    assert config.use_dynamic_batch_size and config.balance_data
    assert (config.model.hidden_size, config.model.num_layers, config.model.hf_checkpoint) == (16, 2, "/m")
    # slime-train's finalize: --balance-by-flops turns on --balance-data
    from slime.cli.train import parse_train_args

    dynamic = ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "100", "--balance-by-flops"]
    assert TrainBatchConfig.from_args(parse_train_args(dynamic)).balance_data


def test_a_namespace_missing_a_flag_is_an_error_naming_it_not_a_second_default():
    args = vars(build_parser().parse_args([]))
    del args["moe_router_topk"]
    with pytest.raises(AttributeError, match="moe_router_topk"):
        TrainBatchConfig.from_args(argparse.Namespace(**args))


def test_the_flops_model_reads_the_configs_shape():
    args = build_parser().parse_args(MODEL)
    flops = FlopsModel.of(TrainBatchConfig.from_args(args).model)
    assert flops == FlopsModel.from_args(args)
    assert (flops.linear, flops.quadratic) == (17408.0, 64.0)  # as in tests/test_slime_parity.py


def test_slimes_build_dp_schedule_of_args_is_the_split_of_its_config():
    """slime's signature (a namespace slime's test builds by hand) reads the same config the controller does."""
    lengths = [1, 2, 3, 4, 5, 7, 9, 10]
    flags = {"balance_data": True, "micro_batch_size": 1, **SHAPE}
    parts, micro, counts, sizes = build_dp_schedule(
        SimpleNamespace(**flags), {"dp_size": 2}, lengths, global_batch_size=8, rollout_indices=list(range(8))
    )
    config = TrainBatchConfig.from_args(completed(SimpleNamespace(global_batch_size=8, **flags)))
    ours = schedule_for(config, {"tokens": [[0] * n for n in lengths], "rollout_ids": list(range(8))}, {"dp_size": 2})
    assert (parts, micro, counts, sizes) == (
        ours.partitions,
        ours.micro_batch_indices,
        ours.num_microbatches,
        ours.global_batch_sizes,
    )
    assert parts == [[1, 2, 5, 6], [0, 3, 4, 7]]  # balanced by FLOPs, as slime's own test expects


def readers_outside_the_contract(root=None) -> list[str]:
    """The files of `PACKAGES` that read a flag off `args` and are not named in `STILL_READ_FROM_ARGS`."""
    found: set[str] = set()
    for package in PACKAGES:
        found |= set(flag_reads(package, DESTS) if root is None else flag_reads(package, DESTS, root))
    return sorted(found - set(STILL_READ_FROM_ARGS))


def test_only_the_named_files_read_flags_off_args():
    """rank_batches and flops read `TrainBatchConfig` (before: 12 flags in 2 files), dp_schedule reads it from
    slime's `args` once (before: 4 flags), so a new `args.<flag>` read in these packages fails here."""
    assert readers_outside_the_contract() == []
    reads: set[str] = set()
    for package in PACKAGES:
        reads |= set(flag_reads(package, DESTS))
    assert sorted(set(STILL_READ_FROM_ARGS) - reads) == [], "no longer reads args: drop it from the list"


def test_a_flag_read_off_args_in_these_packages_is_found(tmp_path):
    for rel, text in {
        "slime/train_batch/rank_batches.py": "def f(self):\n    return self.args.micro_batch_size\n",
        "slime/utils/dp_schedule.py": "def g(args):\n    return getattr(args, 'balance_data')\n",
        "slime/engine/default_model.py": "def h(args):\n    return args.rollout_backend\n",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert readers_outside_the_contract(tmp_path) == ["slime/train_batch/rank_batches.py", "slime/utils/dp_schedule.py"]
