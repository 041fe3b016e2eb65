"""The rollout reads its flags as one frozen `RolloutConfig` (issue #33), inside a `RolloutRunConfig` that adds the
few flags it reads that other parts declare (the checkpoint, save/load, slime's hook paths, the retry window).
The controller reads it once; a plugin's `args` reaches it through the runtime (`RolloutRuntime.config`). Only
the files that implement slime's plugin contract (a signature slime defines as taking `args`) still read flags
off `args`; our own code below them gets the config."""

from __future__ import annotations

import dataclasses
import pickle
from types import SimpleNamespace

import pytest

from slime.cli.parser import build_parser
from slime.rollout.flags import PromptConfig, RolloutConfig, RolloutRunConfig
from slime.rollout.runtime import RolloutRuntime, config_for, reread_config, unbind
from slime.utils.plugin_args import completed
from tests.args_reads import flag_reads

# every flag of the parser, and the `--sglang-*` passthrough parse_args stores beside them
DESTS = {a.dest for a in build_parser()._actions if a.option_strings} | {"sglang_extra_args"}  # noqa: SLF001

# file -> why it reads `args.<flag>`: slime defines its functions as taking `args` (its plugin contract), and
# users call or replace them with a namespace our parser built
PLUGIN_CONTRACT = {
    "slime/rollout/sglang_rollout.py": "slime's generate_rollout(args, rollout_id, data_source, evaluation), "
    "generate_and_rm(args, sample, sampling_params, evaluation), generate_and_rm_group(args, group, ...), "
    "GenerateState(args)",
    "slime/rollout/default_generate.py": "slime's generate(args, sample, sampling_params) "
    "(at slime.rollout.sglang_rollout.generate)",
    "slime/rollout/sft_rollout.py": "slime's generate_rollout(args, rollout_id, data_buffer, evaluation) "
    "at slime.rollout.sft_rollout",
    "slime/rollout/fully_async_rollout.py": "slime's generate_rollout_fully_async(args, rollout_id, data_buffer, "
    "evaluation) and its worker, built from args",
    "slime/rollout/data_source.py": "slime's RolloutDataSource(args) / RolloutDataSourceWithBuffer(args) "
    "(--data-source-path classes are built as cls(args))",
    "slime/rollout/rm_hub/__init__.py": "slime's async_rm(args, sample) and batched_async_rm(args, samples)",
    "slime/rollout/on_policy_distillation.py": "slime's reward_func(args, sample) and "
    "post_process_rewards(args, samples) for on-policy distillation",
    "slime/rollout/train_data.py": "slime's convert_samples_to_train_data(args, samples) and "
    "_post_process_rewards(args, samples)",
    "slime/rollout/sampling_params.py": "GenerateState(args).sampling_params: slime's sampling parameters of args "
    "(sampling_params_from_args, re-exported at slime.rollout.sglang_rollout)",
    "slime/rollout/sample_hooks.py": "slime's module: apply_rollout_sample_hooks(args, sample, evaluation=...), "
    "called so by slime's sglang_rollout and by slime's test_rollout_sample_hooks",
}


def test_the_config_of_a_minimal_command_line_is_the_parsers_defaults():
    args = build_parser().parse_args([])
    assert RolloutConfig.from_args(args) == RolloutConfig()
    run = RolloutRunConfig.from_args(args)
    assert run.rollout == RolloutConfig()
    # the fields declared elsewhere have no defaults of their own: the parser's are the only ones
    for config in (run, run.prompt):
        for f in dataclasses.fields(config):
            if f.name not in ("rollout", "prompt"):
                assert f.default is dataclasses.MISSING, f.name
                assert getattr(config, f.name) == getattr(args, f.name), f.name
    assert run.prompt == PromptConfig.from_args(args)
    # frozen, and what a pickled runtime config looks like on the other side
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.rollout.partial_rollout = True  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(run)) == run


def test_the_flags_given_reach_the_config():
    args = build_parser().parse_args(
        [
            *("--rollout-batch-size", "3", "--over-sampling-batch-size", "6", "--partial-rollout"),
            *("--reward-timeout", "2", "--group-rm", "--abort-timeout", "1.5", "--hf-checkpoint", "/m"),
            *("--save", "/s", "--load", "/l", "--request-retry-window", "7"),
        ]
    )
    run = RolloutRunConfig.from_args(args)
    rollout = run.rollout
    assert (rollout.rollout_batch_size, rollout.over_sampling_batch_size, rollout.partial_rollout) == (3, 6, True)
    assert (rollout.reward_timeout, rollout.group_rm, rollout.abort_timeout) == (2.0, True, 1.5)
    assert (run.hf_checkpoint, run.save, run.load, run.request_retry_window) == ("/m", "/s", "/l", 7.0)
    assert (run.prompt.hf_checkpoint, run.prompt.over_long_prompt) == ("/m", "filter")


def test_the_runtime_reads_its_args_once_and_a_plugins_own_namespace_is_read_as_given():
    args = completed(SimpleNamespace(rollout_batch_size=5))
    runtime = RolloutRuntime(args, client=None)
    assert runtime.config.rollout.rollout_batch_size == 5
    assert runtime.config is runtime.config  # read once
    assert config_for(args, runtime) is runtime.config
    own = completed(SimpleNamespace(rollout_batch_size=2))  # a plugin calling with a namespace of its own
    assert config_for(own, runtime).rollout.rollout_batch_size == 2
    assert config_for(own, None).rollout.rollout_batch_size == 2  # a stand-in GenerateState has no runtime
    # a rollout's start reads the namespace again (its caller may change it between rollouts), for its groups too
    args.rollout_batch_size = 7
    runtime.bind()
    try:
        assert reread_config(args).rollout.rollout_batch_size == runtime.config.rollout.rollout_batch_size == 7
    finally:
        unbind(runtime)


def readers_outside_the_contract(root=None) -> list[str]:
    """The files of `slime/rollout` that read a flag off `args` and are not slime's plugin contract."""
    reads = flag_reads("slime/rollout", DESTS) if root is None else flag_reads("slime/rollout", DESTS, root)
    return sorted(set(reads) - set(PLUGIN_CONTRACT))


def test_only_slimes_plugin_contract_reads_flags_off_args():
    """Our rollout code (controller, engine client, runtime, rollout loop, leftovers, reward step and check,
    partial rollout, evaluation, prompt reading) gets a config; a new `args.<flag>` read in one of its files
    fails here. (Before: 68 flags read in 23 files.)"""
    assert readers_outside_the_contract() == []
    reads = flag_reads("slime/rollout", DESTS)
    assert sorted(set(PLUGIN_CONTRACT) - set(reads)) == [], "no longer reads args: drop it from PLUGIN_CONTRACT"


def test_a_flag_read_off_args_in_our_code_is_found(tmp_path):
    package = tmp_path / "slime" / "rollout"
    package.mkdir(parents=True)
    (package / "leftovers.py").write_text("def f(args):\n    return args.abort_timeout\n")
    (package / "sglang_rollout.py").write_text("def g(args):\n    return args.partial_rollout\n")
    assert readers_outside_the_contract(tmp_path) == ["slime/rollout/leftovers.py"]
