"""`slime.rollout.sglang_rollout` and `fully_async_rollout` split by idea: every name stays importable
from them, each defined once, and the train loop reaches the group step through `sglang_rollout`, where
slime's plugins patch it."""

from __future__ import annotations

from slime.cli.args import parse_args
from slime.rollout import (
    default_generate,
    evaluation,
    failures,
    fully_async_rollout,
    rollout_loop,
    sampling_params,
    sglang_rollout,
    worker_hub,
)
from slime.rollout.data_source import DataSource
from slime.rollout.runtime import unbind
from slime.testing.runtime import bind_runtime
from slime.utils.async_utils import run
from slime.utils.types import Sample

# what slime's plugins, our plugins and tests import from slime.rollout.sglang_rollout
MOVED = {
    "generate": default_generate,
    "prompt_ids": default_generate,
    "mark_failed": failures,
    "sampling_params_from_args": sampling_params,
    "group_sampling_params": sampling_params,
    "eval_prompts": evaluation,
    "eval_sampling_params": evaluation,
    "eval_reward": evaluation,
    "MAX_DROPPED_PER_KEPT": rollout_loop,
}
DEFINED_HERE = [
    "GenerateState",
    "abort",
    "eval_rollout",
    "eval_rollout_single_dataset",
    "generate_and_rm",
    "generate_and_rm_group",
    "generate_function",
    "generate_rollout",
    "generate_rollout_async",
    "get_model_url",
]


def test_every_name_plugins_import_is_still_at_slimes_path_and_defined_once():
    assert sorted(sglang_rollout.__all__) == sorted([*MOVED, *DEFINED_HERE, "load_function"])
    for name, home in MOVED.items():
        assert getattr(sglang_rollout, name) is getattr(home, name), name
    for name in DEFINED_HERE:
        assert getattr(sglang_rollout, name).__module__ == "slime.rollout.sglang_rollout", name
    assert sglang_rollout.generate.supports_partial_rollout is True


def test_the_fully_async_names_stay_at_slimes_path():
    assert sorted(fully_async_rollout.__all__) == [
        "AsyncRolloutWorker",
        "WorkerHub",
        "generate_rollout_fully_async",
        "worker_hub",
    ]
    assert fully_async_rollout.WorkerHub is worker_hub.WorkerHub
    assert fully_async_rollout.worker_hub is worker_hub.worker_hub
    # looked up in fully_async_rollout at call time, where slime's tests patch them
    assert fully_async_rollout.GenerateState is sglang_rollout.GenerateState
    assert fully_async_rollout.generate_and_rm_group is sglang_rollout.generate_and_rm_group


def test_the_train_loop_runs_each_group_through_the_patched_generate_and_rm_group(monkeypatch, tmp_path):
    calls = []

    async def answer_one_token(args, group, params, evaluation=False):
        calls.append((len(group), params, evaluation))
        for s in group:
            s.tokens, s.response_length, s.reward, s.status = [7, 8], 1, 0.5, Sample.Status.COMPLETED
        return group

    monkeypatch.setattr(sglang_rollout, "generate_and_rm_group", answer_one_token)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(f'{{"input": "q{i}", "label": "a"}}\n' for i in range(4)))
    args = parse_args(
        [
            "--rollout-backend",
            "hf",
            "--prompt-data",
            str(prompts),
            "--rollout-batch-size",
            "2",
            "--over-sampling-batch-size",
            "3",
            "--n-samples-per-prompt",
            "2",
        ]
    )
    data = DataSource(args, [Sample(prompt=f"q{i}") for i in range(4)], 2)
    runtime = bind_runtime(args)
    try:
        out = sglang_rollout.generate_rollout(args, 5, data)
    finally:
        unbind(runtime)
        run(runtime.client.close())
    assert calls == [(2, sampling_params.sampling_params_from_args(args), False)] * 3
    assert [[s.reward for s in g] for g in out.samples] == [[0.5, 0.5], [0.5, 0.5]]
    # the third group finished after the target: back in the buffer at its prompt, its 2 tokens wasted
    assert [[(s.response_length, s.status) for s in g] for g in data.buffer] == [[(0, Sample.Status.PENDING)] * 2]
    assert out.metrics["rollout/wasted_tokens"] == 2 and out.metrics["rollout/aborted_samples"] == 0
