"""A reward function that never returns fails its sample (reward_timeout, naming --reward-timeout and
the sample) and the group's other samples keep their rewards; it hung the rollout before."""

from __future__ import annotations

import asyncio

from slime.cli.args import parse_args
from slime.rollout.failures import failure_reasons
from slime.rollout.flags import RolloutConfig
from slime.rollout.reward_step import reward_group
from slime.utils.types import Sample

OUTER_BOUND_S = 60.0  # the old code waited forever: fail instead of hanging the suite


def group(n: int) -> list[Sample]:
    return [Sample(index=i, group_index=0, prompt="p", response="r", status=Sample.Status.COMPLETED) for i in range(n)]


async def test_a_hung_reward_fails_its_sample_and_the_others_are_scored():
    args = parse_args(["--custom-rm-path", "tests.plugins.hung_rewards.hangs_on_odd", "--reward-timeout", "0.3"])
    samples = group(4)
    await asyncio.wait_for(reward_group(RolloutConfig.from_args(args), args, samples, evaluation=False), OUTER_BOUND_S)
    assert [s.reward for s in samples] == [1.0, 0.0, 1.0, 0.0]
    assert [s.status for s in samples] == [Sample.Status.COMPLETED, Sample.Status.FAILED] * 2
    counts, examples = failure_reasons(samples)
    assert counts == {"reward_timeout": 2}
    assert examples["reward_timeout"] == (
        "sample 1: --custom-rm-path 'tests.plugins.hung_rewards.hangs_on_odd' on sample 1 "
        "(group 0): did not return within 0.3 s (--reward-timeout)"
    )


async def test_a_hung_group_reward_fails_the_group():
    args = parse_args(
        ["--custom-rm-path", "tests.plugins.hung_rewards.group_hangs", "--group-rm", "--reward-timeout", "0.3"]
    )
    samples = group(2)
    await asyncio.wait_for(reward_group(RolloutConfig.from_args(args), args, samples, evaluation=False), OUTER_BOUND_S)
    assert failure_reasons(samples)[0] == {"reward_timeout": 2}


def test_the_reward_timeout_has_a_bound_by_default():
    assert parse_args([]).reward_timeout == 1800.0


async def test_a_hung_custom_generate_fails_its_sample_and_the_rollout_goes_on(
    tiny_model_dir, runtime_closed_on_the_test_loop
):
    from slime.rollout.sglang_rollout import generate_and_rm_group
    from slime.testing.runtime import bind_runtime
    from slime.utils.processing_utils import load_tokenizer

    args = parse_args(
        [
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--sglang-router-ip",
            "127.0.0.1",
            "--sglang-router-port",
            "9",
            "--custom-generate-function-path",
            "tests.plugins.hung_rewards.generate_hangs_on_odd",
            "--custom-generate-timeout",
            "0.3",
            "--custom-rm-path",
            "tests.plugins.hung_rewards.hangs_on_odd",
        ]
    )
    bind_runtime(args, tokenizer=load_tokenizer(str(tiny_model_dir)))
    samples = await asyncio.wait_for(generate_and_rm_group(args, group(2), {}), OUTER_BOUND_S)
    assert [s.status for s in samples] == [Sample.Status.COMPLETED, Sample.Status.FAILED]
    counts, examples = failure_reasons(samples)
    assert counts == {"generate_timeout": 1}
    assert examples["generate_timeout"].endswith(
        "(tests.plugins.hung_rewards.generate_hangs_on_odd) did not return within 0.3 s on sample 1 "
        "(--custom-generate-timeout)"
    ), examples
