"""slime's behaviour behind slime's names (issue 22): what slime's recipes rely on, beyond the upstream
tests in ../shared/upstream (run by .ci/run). One section per item of the issue."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
import subprocess
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.cli.args import build_parser, parse_args
from slime.cli.honest_flags import ACTED_ON, unused_flags, unused_flags_line
from slime.cli.preflight import PreflightError, check_prompt_file
from slime.rollout import sglang_rollout
from slime.rollout.controller import BatchError, convert_samples_to_train_data, normalization_groups
from slime.rollout.data_source import DataError, build_prompt_samples, pop_first
from slime.rollout.flags import RolloutConfig
from slime.rollout.reward_check import fail_invalid_rewards
from slime.rollout.runtime import unbind
from slime.utils.async_utils import run
from slime.utils.plugin_args import completed
from slime.utils.types import Sample

ROOT = Path(__file__).resolve().parents[1]


def sample(index, reward, group=None, n_tokens=2):
    return Sample(
        index=index,
        group_index=group,
        prompt="p",
        tokens=[1] * (n_tokens + 1),
        response_length=n_tokens,
        reward=reward,
        status=Sample.Status.COMPLETED,
    )


def grpo_args(**kw):
    base = dict(
        advantage_estimator="grpo",
        n_samples_per_prompt=2,
        reward_key=None,
        custom_reward_post_process_path=None,
        custom_convert_samples_to_train_data_path=None,
    )
    return SimpleNamespace(**{**base, **kw})


# ---- item 1: normalisation by position when samples carry no group_index ------------------------
def test_samples_without_group_index_are_normalised_by_position_in_groups_of_n():
    samples = [sample(i, r) for i, r in enumerate([1.0, 0.0, 1.0, 1.0])]
    batch = convert_samples_to_train_data(grpo_args(), samples)
    half = 0.5 / (0.5**0.5 + 1e-6)  # (1 - 0.5) / (sample std 0.7071 + eps)
    assert batch["rewards"] == pytest.approx([half, -half, 0.0, 0.0], abs=1e-9)
    assert batch["raw_reward"] == [1.0, 0.0, 1.0, 1.0]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 4), rewards=st.lists(st.integers(-3, 3), min_size=1, max_size=12))
def test_by_position_is_per_group_when_the_groups_are_consecutive_and_whole(n, rewards):
    rewards = rewards[: len(rewards) - len(rewards) % n] or [0] * n
    without = [sample(i, float(r)) for i, r in enumerate(rewards)]
    with_index = [sample(i, float(r), group=i // n) for i, r in enumerate(rewards)]
    args = grpo_args(n_samples_per_prompt=n)
    assert normalization_groups(args, without) == normalization_groups(args, with_index)
    assert (
        convert_samples_to_train_data(args, without)["rewards"]
        == convert_samples_to_train_data(args, with_index)["rewards"]
    )


def test_group_index_decides_the_groups_whatever_their_sizes():
    samples = [sample(0, 3.0, group=7), sample(1, 1.0, group=8), sample(2, 2.0, group=8), sample(3, 3.0, group=8)]
    assert normalization_groups(grpo_args(), samples) == [[0], [1, 2, 3]]
    rewards = convert_samples_to_train_data(grpo_args(disable_grpo_std_normalization=True), samples)["rewards"]
    assert rewards == [0.0, -1.0, 0.0, 1.0]


def test_unequal_groups_without_group_index_are_one_group_with_a_warning(caplog):
    samples = [sample(i, r) for i, r in enumerate([0.0, 1.0, 2.0])]  # 3 is not a multiple of n=2
    with caplog.at_level(logging.WARNING):
        groups = normalization_groups(grpo_args(), samples)
    assert groups == [[0, 1, 2]]
    assert "3 samples lack group_index and 3 is not a multiple of --n-samples-per-prompt 2" in caplog.text


# ---- item 2: non-string prompts ------------------------------------------------------------------
@pytest.fixture
def index_prompts(tmp_path):
    path = tmp_path / "tau.jsonl"
    path.write_text("".join(json.dumps({"index": i, "label": "x"}) + "\n" for i in (3, 5)))
    return path


def test_non_string_prompts_pass_through_without_a_chat_template(index_prompts):
    # a rollout function of the user's own reads the prompt as it is (ours needs text or messages)
    args = completed(SimpleNamespace(apply_chat_template=False, rollout_function_path="my_plugin.generate_rollout"))
    samples, _ = build_prompt_samples(args, index_prompts, "index", "label", None)
    assert [s.prompt for s in samples] == [3, 5] and all(s.tokens == [] for s in samples)


def test_a_chat_template_over_a_non_string_prompt_is_an_error_naming_the_key_and_line(index_prompts):
    with pytest.raises(DataError, match=r"tau.jsonl:1: key 'index' is int; --apply-chat-template needs"):
        build_prompt_samples(
            completed(SimpleNamespace(apply_chat_template=True)), index_prompts, "index", "label", None
        )
    args = parse_args(
        [
            "--rollout-backend",
            "hf",
            "--prompt-data",
            str(index_prompts),
            "--input-key",
            "index",
            "--apply-chat-template",
        ]
    )
    with pytest.raises(PreflightError, match=r"--prompt-data: .*tau.jsonl:1: key 'index' is int; --apply-chat"):
        check_prompt_file(args, "--prompt-data", str(index_prompts), "index", "label", tokenizer=object())


def test_the_default_generate_refuses_a_non_string_prompt_naming_the_flag():
    with pytest.raises(TypeError, match="the prompt is int.*--custom-generate-function-path"):
        sglang_rollout.prompt_ids(SimpleNamespace(), Sample(index=4, prompt=3))


# ---- items 3, 5, 6: generate_and_rm through GenerateState, raw rewards ---------------------------
class StandInState:
    """A plugin's own GenerateState (as slime's tests patch it): no runtime behind it."""

    def __init__(self, args):
        self.aborted = getattr(args, "stand_in_aborted", False)
        self.semaphore = asyncio.Semaphore(1)

    @contextmanager
    def dp_rank_context(self):
        yield 0


@pytest.fixture
def stand_in_state(monkeypatch):
    monkeypatch.setattr(sglang_rollout, "GenerateState", StandInState)


async def answer_with_text(args, sample, sampling_params, evaluation=False):
    sample.tokens, sample.response_length, sample.response = [1, 2, 3], 2, f"eval={evaluation}"
    sample.status = Sample.Status.COMPLETED
    return sample


async def dict_reward(args, sample, **kw):
    return {"score": 1.0, "teacher": [0.5, 0.25]}


def rm_args(**kw):
    base = dict(
        partial_rollout=False,
        group_rm=False,
        custom_generate_function_path=None,
        custom_rm_path=f"{__name__}.dict_reward",
        rm_type=None,
        reward_key=None,
        rollout_sample_hook_path=[],
    )
    base.update(kw)
    return SimpleNamespace(**base)


def test_a_per_sample_generate_function_wins_and_learns_it_runs_for_eval(stand_in_state):
    s = Sample(index=0, prompt="p", generate_function_path=f"{__name__}.answer_with_text")
    out = run(sglang_rollout.generate_and_rm(rm_args(custom_generate_function_path="no.such.fn"), s, {}, True))
    assert out.response == "eval=True" and out.reward == {"score": 1.0, "teacher": [0.5, 0.25]}


def test_an_aborted_generate_state_starts_no_generation(stand_in_state):
    s = Sample(index=0, prompt="p")
    out = run(sglang_rollout.generate_and_rm(rm_args(stand_in_aborted=True), s, {}))
    assert out.status == Sample.Status.ABORTED and out.reward is None


def test_raw_rewards_are_kept_until_the_batch_and_then_must_be_numbers(stand_in_state):
    args = rm_args(custom_generate_function_path=f"{__name__}.answer_with_text")
    group = run(sglang_rollout.generate_and_rm_group(args, [Sample(index=i, group_index=0) for i in range(2)], {}))
    assert [s.reward for s in group] == [{"score": 1.0, "teacher": [0.5, 0.25]}] * 2
    assert group[0].get_reward_value(args) == {"score": 1.0, "teacher": [0.5, 0.25]}  # slime's: as returned
    assert group[0].get_reward_value(SimpleNamespace(reward_key="score")) == 1.0
    assert fail_invalid_rewards(RolloutConfig.from_args(args), group) == 2
    assert group[0].metadata["error"] == (
        f"--custom-rm-path '{__name__}.dict_reward' returned a dict with keys ['score', 'teacher']; pick one with "
        "--reward-key or turn it into numbers with --custom-reward-post-process-path for sample 0 (group 0)"
    )


def teacher_post_process(args, samples):
    raw = [s.reward["score"] for s in samples]
    return raw, [r - sum(s.reward["teacher"]) for r, s in zip(raw, samples)]


def broken_post_process(args, samples):
    return [s.reward for s in samples], [0.0] * len(samples)


def test_the_post_process_hook_turns_raw_rewards_into_numbers_and_is_checked():
    samples = [sample(i, {"score": 1.0, "teacher": [0.5, 0.25]}, group=0) for i in range(2)]
    batch = convert_samples_to_train_data(
        grpo_args(custom_reward_post_process_path=f"{__name__}.teacher_post_process"), samples
    )
    assert batch["raw_reward"] == [1.0, 1.0] and batch["rewards"] == [0.25, 0.25]
    with pytest.raises(
        BatchError,
        match=r"--custom-reward-post-process-path '.*broken_post_process' returned "
        r"\{'score'.*\(dict\), not a number in raw_rewards for sample index=0",
    ):
        convert_samples_to_train_data(
            grpo_args(custom_reward_post_process_path=f"{__name__}.broken_post_process"), samples
        )


def test_rollout_functions_have_slimes_four_parameters():
    from rollout_plugins import multi_turn
    from slime.rollout import fully_async_rollout, sft_rollout

    for fn in (
        sglang_rollout.generate_rollout,
        fully_async_rollout.generate_rollout_fully_async,
        sft_rollout.generate_rollout,
        multi_turn.generate_rollout,
    ):
        assert tuple(inspect.signature(fn).parameters) == ("args", "rollout_id", "data_source", "evaluation") or tuple(
            inspect.signature(fn).parameters
        ) == ("args", "rollout_id", "data_buffer", "evaluation")
    assert tuple(inspect.signature(pop_first).parameters) == ("args", "rollout_id", "buffer", "num_samples")
    assert tuple(inspect.signature(sglang_rollout.generate_and_rm).parameters) == (
        "args",
        "sample",
        "sampling_params",
        "evaluation",
    )


# ---- item 5: an eval dataset's custom_generate_function_path and custom_rm_path -----------------
async def number_reward(args, sample, **kw):
    return 0.5


def test_an_eval_dataset_uses_its_own_generate_and_reward_functions(tmp_path):
    from slime.testing.runtime import bind_runtime

    data, tau_data = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"input": f"q{i}", "label": "a"}) + "\n" for i in range(2)))
    # tau-bench's prompts are task indices: read by the dataset's own generate, not refused as non-text
    tau_data.write_text("".join(json.dumps({"input": i, "label": "a"}) + "\n" for i in range(2)))
    config = tmp_path / "eval.yaml"
    config.write_text(
        f"eval:\n  datasets:\n    - name: tau\n      path: {tau_data}\n"
        f"      custom_generate_function_path: {__name__}.answer_with_text\n"
        f"      custom_rm_path: {__name__}.number_reward\n      n_samples_per_eval_prompt: 2\n"
    )
    args = parse_args(
        ["--rollout-backend", "hf", "--prompt-data", str(data), "--eval-config", str(config), "--label-key", "label"]
    )
    runtime = bind_runtime(args)
    try:
        out = sglang_rollout.generate_rollout(args, 3, None, evaluation=True)
    finally:
        unbind(runtime)
        run(runtime.client.close())
    tau = out.data["tau"]
    assert [s.response for s in tau["samples"]] == ["eval=True"] * 4
    assert sorted(s.prompt for s in tau["samples"]) == [0, 0, 1, 1]
    assert tau["rewards"] == [0.5] * 4


# ---- item 7: slime's names; --balance-data by FLOPs ----------------------------------------------
MODEL = dict(
    hidden_size=16,
    num_attention_heads=2,
    num_query_groups=2,
    vocab_size=32,
    ffn_hidden_size=64,
    num_experts=None,
    num_layers=2,
    kv_channels=8,
)


def test_forward_flops_follow_slimes_cost_model():
    from slime.train_batch.flops import FlopsModel

    flops = FlopsModel.from_args(completed(SimpleNamespace(**MODEL)))
    # per layer: qkv 1536 s + attention 32 s^2 + output 512 s + mlp 6144 s; 2 layers; lm head 1024 s
    assert (flops.linear, flops.quadratic) == (17408.0, 64.0)
    assert flops(10) == 17408 * 10 + 64 * 100


def test_flops_need_the_model_shape_and_say_which_flags(tmp_path):
    from slime.train_batch.flops import FlopsModel, FlopsModelError

    with pytest.raises(FlopsModelError, match="--hidden-size, --num-attention-heads.*or --hf-checkpoint"):
        FlopsModel.from_args(completed(SimpleNamespace(hf_checkpoint=None)))
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 16,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "vocab_size": 32,
                "head_dim": 8,
            }
        )
    )
    assert FlopsModel.from_args(completed(SimpleNamespace(hf_checkpoint=str(tmp_path)))).linear == 17408.0


def test_balance_data_weights_ranks_by_flops_not_tokens():
    from slime.train_batch.flags import TrainBatchConfig
    from slime.train_batch.rank_batches import schedule_for

    lengths = [1, 2, 3, 4, 5, 7, 9, 10]
    batch = {"tokens": [[0] * n for n in lengths], "rollout_ids": list(range(8))}
    config = {"dp_size": 2}

    def split(balance_data: bool):
        args = completed(SimpleNamespace(balance_data=balance_data, global_batch_size=8, **MODEL))
        return schedule_for(TrainBatchConfig.from_args(args), batch, config)

    by_flops, by_tokens = split(True), split(False)
    assert by_flops.partitions == [[1, 2, 5, 6], [0, 3, 4, 7]]  # slime's own test expects this split
    assert by_tokens.partitions == [[1, 3, 4, 7], [0, 2, 5, 6]]


def test_slimes_misc_and_http_helpers_behave_as_slimes():
    from slime.utils import http_utils, misc

    class One(metaclass=misc.SingletonMeta):
        def __init__(self, value):
            self.value = value

    assert One(1) is One(2) and One(3).value == 1  # slime's: later arguments are ignored
    One.clear_instances()
    assert One(4).value == 4
    assert misc.group_by([1, 2, 3, 4], key=lambda x: x % 2) == {1: [1, 3], 0: [2, 4]}
    assert [misc.should_run_periodic_action(i, 3, num_rollout=8) for i in range(8)] == [
        False,
        False,
        True,
        False,
        False,
        True,
        False,
        True,
    ]
    assert misc.Box("ref").inner == "ref"
    assert http_utils._wrap_ipv6("::1") == "[::1]" and http_utils._wrap_ipv6("10.0.0.1") == "10.0.0.1"
    assert http_utils.get_host_info()[1] == "127.0.0.1"
    port = http_utils.find_available_port(20000)
    assert port > 20000 and http_utils.is_port_available(port)


# ---- item 8: abort without a fleet asks the router for its workers -------------------------------
def test_without_a_fleet_abort_reaches_every_worker_the_router_lists(fleet_of):
    from slime.rollout.engine_client import EngineClient
    from slime.utils.endpoints import Endpoints

    router, engines = fleet_of(lambda body: {"output_ids": [1], "finish_type": "stop"}, 2)
    client = EngineClient(Endpoints(router.url, []))  # what current(args) builds from --sglang-router-ip/port

    async def abort():
        try:
            await client.abort_all()
        finally:
            await client.close()

    run(abort())
    assert [e.aborts for e in engines] == [[{"abort_all": True}], [{"abort_all": True}]]


# ---- item 9: one start-up line for flags that do nothing here ------------------------------------
def test_flags_that_do_nothing_here_are_named_once_with_why(caplog):
    argv = [
        "--rollout-backend",
        "hf",
        "--update-weight-mode",
        "delta",
        "--update-weight-transport",
        "disk",
        "--tensor-model-parallel-size",
        "2",
        "--sglang-enable-foo",
        "--lr",
        "1e-5",
        "--sglang-enable-deterministic-inference",
    ]  # (the rollout reads that one: sampling seeds)
    with caplog.at_level(logging.WARNING, logger="slime.cli.args"):
        parse_args(argv)
    [line] = [r.getMessage() for r in caplog.records]
    assert line == (
        "slime-rollout: 4 flag(s) accepted but not acted on -- Megatron-LM trainer options (the trainer here is a "
        "torch one; parallelism, kernels and checkpoint formats are Megatron's): --tensor-model-parallel-size; "
        "SGLang server options (the embedded engine has none of them): --sglang-enable-foo; slime trainer options "
        "this trainer does not implement (e.g. delta weight sync): --update-weight-mode --update-weight-transport"
    )
    parser = build_parser("x")
    plain, _ = parser.parse_known_args(["--rollout-backend", "hf", "--lr", "1e-5"])
    assert unused_flags(parser, plain) == {} and unused_flags_line(parser, plain) is None


def test_every_flag_counted_as_acted_on_is_read_by_the_code():
    files = subprocess.run(
        ["git", "ls-files", "slime/*.py", "rollout_plugins/*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    source = "\n".join((ROOT / f).read_text() for f in files if not f.endswith("honest_flags.py"))
    # a typed config's field (`slime/<package>/flags.py`, read from the namespace by `from_args`) counts when
    # the code reads it off the config
    configs = "\n".join((ROOT / f).read_text() for f in files if f.endswith("/flags.py"))

    def read(d: str) -> bool:
        if re.search(rf"(args\.{d}\b|[\"']{d}[\"'])", source):
            return True
        return bool(re.search(rf"^\s+{d}\s*:", configs, re.M)) and bool(re.search(rf"\w\.{d}\b", source))

    unread = sorted(d for d in ACTED_ON if not read(d))
    assert unread == []


# ---- item 10: the user scripts live in tools/ ------------------------------------------------------
def test_user_scripts_are_in_tools_and_the_makefile_uses_them():
    assert sorted(p.name for p in (ROOT / "tools").glob("*.py")) == [
        "gen_docs.py",
        "gen_sglang_contract.py",
        "gen_trainer_flags.py",
        "report.py",
        "rollout_viewer.py",
    ]
    assert not (ROOT / "scripts").exists()
    assert "$(PY) tools/report.py" in (ROOT / "Makefile").read_text()
