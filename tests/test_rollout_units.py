"""Pure parts of the rollout spine: flags, data source, rewards, batch conversion, debug files,
SGLang launch arguments."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

from slime.fleet.engine_server import base_gpu_id, sglang_server_args
from slime.fleet.flags import EngineConfig
from slime.rollout import rm_hub as rm
from slime.rollout.data_source import DataError, DataSource, build_prompt_samples
from slime.rollout.debug_data import DebugDataError, load_debug_rollout, save_debug_rollout
from slime.rollout.controller import BatchError, convert_samples_to_train_data
from slime.cli.args import ArgError, parse_args
from slime.cli.finalize import complete_namespace
from slime.utils.misc import PluginLoadError, load_function
from slime.utils.types import Sample


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------- flags ----------------


def test_args_defaults_and_passthrough(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"input": "x"}])
    args = parse_args(
        [
            "--prompt-data",
            str(data),
            "--rollout-backend",
            "hf",
            "--sglang-attention-backend",
            "triton",
            "--sglang-enable-torch-compile",
            "--eval-prompt-data",
            "a",
            str(data),
        ]
    )
    assert args.sglang_extra_args == {"attention_backend": "triton", "enable_torch_compile": True}
    assert args.eval_datasets == [("a", str(data))]
    assert args.eval_function_path == args.rollout_function_path == "slime.rollout.sglang_rollout.generate_rollout"
    assert args.over_sampling_batch_size == args.rollout_batch_size


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["--prompt-data", "/nonexistent.jsonl"], "--prompt-data"),
        (["--rollout-batch-size", "0"], "--rollout-batch-size"),
        (["--eval-prompt-data", "only_name"], "--eval-prompt-data"),
        (["--sglang-router-ip", "127.0.0.1"], "--sglang-router-ip"),
        (["--rollout-top-p", "1.5"], "--rollout-top-p"),
        (["--hf-checkpoint", "/nonexistent-model"], "--hf-checkpoint"),
        (["--num-rollout", "3", "--save-debug-rollout-data", "/tmp/x.pt"], "--save-debug-rollout-data"),
    ],
)
def test_bad_flags_name_the_flag(argv, flag):
    with pytest.raises(ArgError, match=flag):
        parse_args(["--rollout-backend", "hf", *argv])


def test_load_function_errors_name_flag_and_cause():
    with pytest.raises(PluginLoadError, match=r"--rollout-function-path 'no_such_pkg.mod.fn'.*No module named"):
        load_function("no_such_pkg.mod.fn", "--rollout-function-path")
    with pytest.raises(PluginLoadError, match=r"--custom-rm-path .*has no attribute 'nope'"):
        load_function("slime.rollout.rm_hub.nope", "--custom-rm-path")
    assert load_function("slime.rollout.rm_hub.f1_reward") is rm.f1_reward


def test_sglang_server_args():
    from slime.cli.finalize import complete_namespace

    args = EngineConfig.from_args(
        complete_namespace(
            SimpleNamespace(
                hf_checkpoint="/models/qwen",
                sglang_mem_fraction_static=0.7,
                offload=True,
                rollout_seed=3,
                sglang_extra_args={"attention_backend": "fa3", "enable_metrics": True},
                num_gpus_per_node=8,
                rollout_num_gpus_per_engine=2,
            )
        )
    )
    cmd = sglang_server_args(args, host="10.0.0.2", port=30001, base_gpu_id=base_gpu_id(args, 3), tp_size=2)
    assert cmd[:12] == [
        "--model-path",
        "/models/qwen",
        "--host",
        "10.0.0.2",
        "--port",
        "30001",
        "--tp-size",
        "2",
        "--base-gpu-id",
        "6",
        "--skip-server-warmup",
        "--trust-remote-code",
    ]
    assert ["--mem-fraction-static", "0.7"] == cmd[cmd.index("--mem-fraction-static") :][:2]
    assert "--enable-memory-saver" in cmd and ["--random-seed", "3"] == cmd[cmd.index("--random-seed") :][:2]
    assert cmd[-3:] == ["--attention-backend", "fa3", "--enable-metrics"]
    # an engine spanning two 8-GPU nodes
    args = dataclasses.replace(args, rollout_num_gpus_per_engine=16)
    assert base_gpu_id(args, 1) == 0
    multi = sglang_server_args(
        args, host="h", port=1, base_gpu_id=0, tp_size=16, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000"
    )
    assert multi[multi.index("--nnodes") :][:6] == [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--dist-init-addr",
        "10.0.0.1:5000",
    ]


# ---------------- data source ----------------


def _args(**kw):
    base = dict(
        metadata_key="metadata",
        tool_key=None,
        apply_chat_template=False,
        rollout_max_context_len=None,
        rollout_max_prompt_len=None,
        over_long_prompt="filter",
        rollout_seed=1,
    )
    base.update(kw)
    return complete_namespace(SimpleNamespace(**base))  # the parser's defaults for the rest, as at any entry


def test_data_source_groups_epochs_buffer_and_state(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"q": {"text": f"p{i}"}, "extra": {"ans": i}} for i in range(3)])
    prompts, _ = build_prompt_samples(_args(), data, "q.text", "extra.ans")
    src = DataSource(_args(), prompts, n_samples_per_prompt=2, shuffle=True)
    g = src.get_samples(2)
    assert [len(x) for x in g] == [2, 2]
    assert [s.group_index for s in g[0]] == [0, 0] and [s.group_index for s in g[1]] == [1, 1]
    assert [s.index for grp in g for s in grp] == [0, 1, 2, 3]
    assert all(s.label == int(s.prompt[1:]) for grp in g for s in grp)
    more = src.get_samples(2)  # crosses into epoch 1
    assert src.epoch_id == 1 and len({s.prompt for s in g[0] + g[1] + more[0]}) == 3
    src.add_samples([g[0]])
    state = json.loads(json.dumps(src.state_dict()))
    clone = DataSource(_args(), prompts, 2, shuffle=True)
    clone.load_state_dict(state)
    assert clone.get_buffer_length() == 1
    a, b = src.get_samples(3), clone.get_samples(3)
    assert [[s.to_dict() for s in x] for x in a] == [[s.to_dict() for s in x] for x in b]
    assert a[0][0].index == 0  # the recycled group comes first


def test_data_source_save_load_files(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"input": f"p{i}"} for i in range(5)])
    prompts, _ = build_prompt_samples(_args(), data, "input", None)
    src = DataSource(_args(), prompts, 1)
    src.get_samples(3)
    src.save(tmp_path / "ckpt", rollout_id=7)
    fresh = DataSource(_args(), prompts, 1)
    assert fresh.load(tmp_path / "ckpt") == 7
    assert fresh.get_samples(1)[0][0].prompt == "p3"


def test_parquet_and_verl_style_keys(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "prompt": [{"role": "user", "content": "hi"}],
            "extra_info": {"answer": "4", "tools_kwargs": {"calc": {"create_kwargs": {"ground_truth": "4"}}}},
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    prompts, _ = build_prompt_samples(
        _args(tool_key="extra_info.tools_kwargs"), tmp_path / "d.parquet", "prompt", "extra_info.answer"
    )
    s = prompts[0]
    assert s.prompt == [{"role": "user", "content": "hi"}] and s.label == "4"
    assert s.metadata["tools_kwargs"] == {"calc": {"create_kwargs": {"ground_truth": "4"}}}


def test_missing_key_names_file_key_and_line(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"input": "a", "label": 1}, {"input": "b"}])
    with pytest.raises(DataError, match=r"d\.jsonl:2: missing label key 'label'"):
        build_prompt_samples(_args(), data, "input", "label")
    with pytest.raises(DataError, match=r"d\.jsonl:1: missing input key 'question'"):
        build_prompt_samples(_args(), data, "question", None)
    (tmp_path / "bad.jsonl").write_text('{"input": "a"}\n{not json\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: invalid JSON"):
        build_prompt_samples(_args(), tmp_path / "bad.jsonl", "input", None)
    with pytest.raises(DataError, match="not found"):
        build_prompt_samples(_args(), tmp_path / "missing.jsonl", "input", None)


def test_over_long_prompts_filtered_or_error(tmp_path, tiny_tokenizer):
    tok = tiny_tokenizer
    data = write_jsonl(tmp_path / "d.jsonl", [{"input": "short"}, {"input": "word " * 50}, {"input": "ok then"}])
    prompts, filtered = build_prompt_samples(_args(rollout_max_context_len=20), data, "input", None, tok)
    assert filtered == 1 and [p.prompt for p in prompts] == ["short", "ok then"]
    assert prompts[0].tokens == tok("short", add_special_tokens=False)["input_ids"]
    with pytest.raises(DataError, match=r"d\.jsonl:2: prompt has \d+ tokens.*--rollout-max-context-len"):
        build_prompt_samples(_args(rollout_max_context_len=20, over_long_prompt="error"), data, "input", None, tok)


def test_apply_chat_template(tmp_path, tiny_tokenizer):
    tok = tiny_tokenizer
    msgs = [{"role": "user", "content": "2+2?"}]
    data = write_jsonl(tmp_path / "d.jsonl", [{"messages": msgs}])
    prompts, _ = build_prompt_samples(_args(apply_chat_template=True), data, "messages", None, tok)
    assert prompts[0].prompt == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert prompts[0].metadata["messages"] == msgs


# ---------------- rewards ----------------


@pytest.mark.parametrize(
    "response,label,expected",
    [
        ("so the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{42}", "\\boxed{42.0}", 1.0),
        ("\\boxed{41}", "42", 0.0),
        ("no box 42", "42", 0.0),
        ("\\boxed{\\text{yes}}", "Yes", 1.0),
    ],
)
def test_math_reward(response, label, expected):
    assert rm.math_reward(response, label) == expected


def test_gsm8k_and_f1():
    assert rm.gsm8k_reward("3 + 4 = 7 #### 7", "Natalia ... #### 7") == 1.0
    assert rm.gsm8k_reward("It is 1,200 dollars", "#### 1200") == 1.0
    assert rm.gsm8k_reward("#### 8", "#### 7") == 0.0
    assert rm.gsm8k_reward("no number", "#### 7") == 0.0
    assert rm.f1_reward("the cat sat", "the cat ran") == pytest.approx(1 / 2)  # slime's f1 drops articles
    assert rm.f1_reward("", "x") == 0.0


async def test_async_rm_dispatch_and_errors():
    s = Sample(response="#### 5", label="#### 5")
    assert await rm.async_rm(SimpleNamespace(custom_rm_path=None, rm_type="gsm8k"), s) == 1.0
    with pytest.raises(ValueError, match="--rm-type 'nope'"):
        await rm.async_rm(SimpleNamespace(custom_rm_path=None, rm_type="nope"), s)
    with pytest.raises(ValueError, match="no reward: set --rm-type"):
        await rm.batched_async_rm(SimpleNamespace(group_rm=True, custom_rm_path=None, rm_type=None), [s])


# ---------------- batch ----------------


def _sample(idx, group, reward, n_resp=2, status=Sample.Status.COMPLETED):
    return Sample(
        group_index=group,
        index=idx,
        tokens=[1, 2, 3] + list(range(10, 10 + n_resp)),
        response_length=n_resp,
        reward=reward,
        loss_mask=[1] * n_resp,
        rollout_log_probs=[-0.1] * n_resp,
        status=status,
    )


def test_group_normalisation_never_across_groups():
    args = SimpleNamespace(
        advantage_estimator="grpo",
        disable_rewards_normalization=False,
        disable_grpo_std_normalization=False,
        reward_key=None,
    )
    # groups of unequal size (2 and 3): each normalised on its own
    samples = [
        _sample(0, 0, 1.0),
        _sample(1, 0, 0.0),
        _sample(2, 1, 5.0),
        _sample(3, 1, 5.0),
        _sample(4, 1, 5.0, status=Sample.Status.TRUNCATED),
    ]
    b = convert_samples_to_train_data(args, samples)
    std0 = 0.5**0.5
    assert b["rewards"][:2] == pytest.approx([0.5 / (std0 + 1e-6), -0.5 / (std0 + 1e-6)])
    assert b["rewards"][2:] == [0.0, 0.0, 0.0]
    assert b["raw_reward"] == [1.0, 0.0, 5.0, 5.0, 5.0]
    assert b["truncated"] == [0, 0, 0, 0, 1] and b["sample_indices"] == [0, 1, 2, 3, 4]
    assert b["response_lengths"] == [2] * 5 and b["loss_masks"][0] == [1, 1]
    assert b["tokens"][0] == [1, 2, 3, 10, 11] and b["rollout_log_probs"][0] == [-0.1, -0.1]
    args.disable_rewards_normalization = True
    assert convert_samples_to_train_data(args, samples)["rewards"] == [1.0, 0.0, 5.0, 5.0, 5.0]
    args.disable_rewards_normalization, args.advantage_estimator = False, "reinforce_plus_plus_baseline"
    assert convert_samples_to_train_data(args, samples)["rewards"][:2] == pytest.approx([0.5, -0.5])


def test_length_invariants_name_the_sample():
    args = SimpleNamespace(advantage_estimator="grpo", disable_rewards_normalization=True, reward_key=None)
    bad = _sample(7, 3, 1.0)
    bad.loss_mask = [1]
    with pytest.raises(BatchError, match="sample index=7 group=3: loss_mask has 1 entries, response_length is 2"):
        convert_samples_to_train_data(args, [bad])
    bad = _sample(8, 3, 1.0)
    bad.rollout_log_probs = [0.0] * 3
    with pytest.raises(BatchError, match="sample index=8.*rollout_log_probs has 3"):
        convert_samples_to_train_data(args, [bad])


# ---------------- debug files ----------------


def test_debug_rollout_round_trip_and_corrupt_file(tmp_path):
    samples = [_sample(0, 0, 1.0), _sample(1, 0, {"score": 0.5, "acc": True})]
    samples[1].metadata = {"turns": 2, "spans": ({"start": 0},)}
    path = save_debug_rollout(str(tmp_path / "r_{rollout_id}.pt"), 3, samples)
    assert path.name == "r_3.pt"
    raw = torch.load(path, weights_only=True)
    assert raw["rollout_id"] == 3 and raw["samples"][0]["status"] == "completed"
    back = load_debug_rollout(str(tmp_path / "r_{rollout_id}.pt"), 3)
    assert [s.to_dict() for s in back][0] == samples[0].to_dict()
    assert back[1].metadata == {"turns": 2, "spans": [{"start": 0}]}
    (tmp_path / "r_4.pt").write_bytes(path.read_bytes()[:100])
    with pytest.raises(DebugDataError, match="r_4.pt is not a valid slime debug rollout file"):
        load_debug_rollout(str(tmp_path / "r_{rollout_id}.pt"), 4)
    with pytest.raises(DebugDataError, match="file not found"):
        load_debug_rollout(str(tmp_path / "r_{rollout_id}.pt"), 5)
    # a pickle carrying an arbitrary object is refused, not executed
    torch.save({"samples": [object()]}, tmp_path / "r_6.pt")
    with pytest.raises(DebugDataError, match="r_6.pt is not a valid"):
        load_debug_rollout(str(tmp_path / "r_{rollout_id}.pt"), 6)


def test_sample_dict_round_trip():
    s = _sample(1, 2, 0.5, status=Sample.Status.ABORTED)
    d = s.to_dict()
    assert d["status"] == "aborted"
    assert Sample.from_dict(d) == s
    # a field from a newer slime is kept aside, not an error
    assert Sample.from_dict({**d, "bogus": 1}).extra_fields == {"bogus": 1}
