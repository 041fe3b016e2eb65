"""`Sample` as slime plugins and slime-written files see it: every field, the dict round trip with
unknown fields kept, `append_response_tokens` semantics, and a search-r1-style plugin built on it."""

from __future__ import annotations

import asyncio
import base64
import logging
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from slime.rollout.debug_data import load_debug_rollout, save_debug_rollout
from slime.rollout.controller import convert_samples_to_train_data
from slime.utils.types import MultimodalTypes, Sample

# slime's Sample fields (slime/utils/types.py, v0.3.1 and later) with their defaults.
SLIME_DEFAULTS = {
    "group_index": None,
    "index": None,
    "rollout_id": None,
    "prompt": "",
    "tokens": [],
    "multimodal_inputs": None,
    "multimodal_train_inputs": None,
    "multimodal_train_input_id": None,
    "apply_chat_template_kwargs": {},
    "response": "",
    "response_length": 0,
    "label": None,
    "reward": None,
    "loss_mask": None,
    "weight_versions": [],
    "rollout_log_probs": None,
    "rollout_top_p_token_ids": None,
    "rollout_top_p_token_offsets": None,
    "rollout_routed_experts": None,
    "remove_sample": False,
    "teacher_log_probs": None,
    "status": "pending",
    "metadata": {},
    "generate_function_path": None,
    "custom_rm_path": None,
    "train_metadata": None,
    "session_id": None,
    "non_generation_time": 0.0,
    "spec_info": {
        "spec_accept_token_num": 0,
        "spec_draft_token_num": 0,
        "spec_verify_ct": 0,
        "completion_token_num": 0,
    },
    "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0},
}


def _args(**kw):
    return SimpleNamespace(**{"sglang_speculative_algorithm": False, "num_layers": 2, "moe_router_topk": 2, **kw})


def _b64(values):
    return base64.b64encode(np.array(values, dtype=np.int32).tobytes()).decode("ascii")


def _slime_dict(**over):
    """A dict as slime's `Sample.to_dict()` writes it (tensors where slime keeps tensors)."""
    d = {
        **SLIME_DEFAULTS,
        "group_index": 1,
        "index": 3,
        "rollout_id": 3,
        "prompt": "Q?",
        "tokens": [5, 6, 7, 8],
        "response": "ab",
        "response_length": 2,
        "label": "42",
        "reward": {"score": 1.0, "acc": True},
        "loss_mask": [1, 0],
        "weight_versions": ["4"],
        "rollout_log_probs": [-0.5, 0.0],
        "rollout_top_p_token_ids": torch.tensor([7, 9, 8], dtype=torch.int32),
        "rollout_top_p_token_offsets": torch.tensor([0, 2, 3], dtype=torch.int32),
        "remove_sample": True,
        "teacher_log_probs": [-0.4, -0.1],
        "status": "truncated",
        "metadata": {"rm_type": "math"},
        "generate_function_path": "my.gen",
        "custom_rm_path": "my.rm",
        "train_metadata": {"loss_type": "sft"},
        "session_id": "s-1",
        "non_generation_time": 1.5,
        "spec_info": {
            "spec_accept_token_num": 3,
            "spec_draft_token_num": 4,
            "spec_verify_ct": 2,
            "completion_token_num": 6,
        },
        "prefix_cache_info": {"cached_tokens": 10, "total_prompt_tokens": 40},
    }
    d.update(over)
    return d


# ---------------------------------------------------------------- fields and dicts


def test_every_slime_field_with_slime_default():
    d = Sample().to_dict()
    assert d == SLIME_DEFAULTS
    assert Sample().status is Sample.Status.PENDING and isinstance(Sample().spec_info, Sample.SpecInfo)
    assert [s.value for s in Sample.Status] == ["pending", "completed", "truncated", "aborted", "failed"]
    assert MultimodalTypes.get("image").placeholder == "<image>"


def test_from_dict_reads_slime_dict_and_keeps_unknown_fields(caplog, tmp_path):
    d = _slime_dict(future_field={"x": 1}, plugin_attr="kept")
    with caplog.at_level(logging.WARNING, logger="slime.utils.types"):
        s = Sample.from_dict(d)
    assert [r.getMessage() for r in caplog.records] == [
        "Sample.from_dict: keeping unknown field(s) ['future_field', 'plugin_attr'] in sample.extra_fields "
        "(written by a newer slime?)"
    ]
    assert s.status is Sample.Status.TRUNCATED and s.rollout_id == 3 and s.custom_rm_path == "my.rm"
    assert s.spec_info == Sample.SpecInfo(3, 4, 2, 6) and s.spec_info.spec_accept_rate == 0.75
    assert s.spec_info.spec_accept_length == 3.0 and s.prefix_cache_info.prefix_cache_hit_rate == 0.25
    assert s.extra_fields == {"future_field": {"x": 1}, "plugin_attr": "kept"}
    assert s.future_field == {"x": 1} and s.plugin_attr == "kept"  # readable as slime's setattr made them
    with pytest.raises(AttributeError, match="no attribute 'other'"):
        s.other  # noqa: B018
    back = s.to_dict()  # unknown fields written back, tensors as lists, everything else identical
    expected = {**d, "rollout_top_p_token_ids": [7, 9, 8], "rollout_top_p_token_offsets": [0, 2, 3]}
    assert back == expected
    torch.save(back, tmp_path / "s.pt")
    assert torch.load(tmp_path / "s.pt", weights_only=True) == expected
    caplog.clear()
    again = Sample.from_dict(back, warn_unknown=False)
    assert again.to_dict() == expected and caplog.records == []


def test_to_dict_keeps_attributes_a_plugin_set():
    s = Sample(index=1)
    s.my_note = "from a plugin"
    assert s.to_dict()["my_note"] == "from a plugin"
    assert Sample.from_dict(s.to_dict(), warn_unknown=False).my_note == "from a plugin"


def test_from_dict_errors_and_leniency():
    assert Sample.from_dict({}).status is Sample.Status.PENDING  # slime's older dumps lack nested infos
    assert Sample.from_dict({"status": Sample.Status.FAILED}).status is Sample.Status.FAILED
    with pytest.raises(ValueError, match="field 'status' has unknown value 'weird'"):
        Sample.from_dict({"status": "weird"})
    with pytest.raises(TypeError, match="expects a dict, got list"):
        Sample.from_dict([1])


def test_reward_value_and_effective_length():
    s = Sample(reward={"score": 0.5, "acc": 1}, response_length=4, loss_mask=[1, 0, 0, 1])
    assert s.get_reward_value(SimpleNamespace(reward_key="acc")) == 1.0
    # slime's: without --reward-key the reward comes back as returned (the batch checks it is a number)
    assert s.get_reward_value(SimpleNamespace(reward_key=None)) == {"score": 0.5, "acc": 1}
    assert s.effective_response_length == 2 and Sample(response_length=3).effective_response_length == 3
    assert Sample(reward=2).get_reward_value(None) == 2 and Sample().get_reward_value() is None


def test_importing_types_does_not_import_torch():
    code = "import sys, slime.utils.types; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(__import__("pathlib").Path(__file__).parents[1]))


# ---------------------------------------------------------------- append_response_tokens


def test_append_model_then_tool_tokens():
    s = Sample(tokens=[1, 2, 3])
    s.append_response_tokens(
        _args(),
        tokens=[10, 11],
        log_probs=[-0.1, -0.2],
        trainable=True,
        meta_info={"finish_reason": {"type": "stop"}, "weight_version": "7", "prompt_tokens": 3, "cached_tokens": 1},
        text="ab",
    )
    s.append_response_tokens(_args(), tokens=[20, 21, 22], trainable=False, text="<tool>")
    assert s.tokens == [1, 2, 3, 10, 11, 20, 21, 22] and s.response == "ab<tool>"
    assert s.response_length == 5 and s.prompt_length == 3
    assert s.loss_mask == [1, 1, 0, 0, 0]
    assert s.rollout_log_probs == [-0.1, -0.2, 0.0, 0.0, 0.0]
    assert s.weight_versions == ["7"] and s.status is Sample.Status.COMPLETED
    assert s.prefix_cache_info.to_dict() == {"cached_tokens": 1, "total_prompt_tokens": 3}
    assert s.spec_info.to_dict()["spec_verify_ct"] == 0  # only counted with --sglang-speculative-algorithm


@pytest.mark.parametrize(
    "finish,status",
    [("length", "truncated"), ("abort", "aborted"), ("stop", "completed"), ("something_new", "pending")],
)
def test_status_from_finish_reason(finish, status):
    s = Sample()
    s.append_response_tokens(_args(), tokens=[], meta_info={"finish_reason": {"type": finish}})
    assert s.status.value == status


def test_terminal_info_only_with_finish_reason_and_flag():
    s = Sample(weight_versions=["1"])
    s.append_response_tokens(_args(), tokens=[4], log_probs=[-1.0], meta_info={"weight_version": "2"})
    assert s.weight_versions == ["1"] and s.status is Sample.Status.PENDING  # no finish_reason: not terminal
    s.append_response_tokens(
        _args(),
        tokens=[5],
        log_probs=[-1.0],
        update_terminal_info=False,
        meta_info={"finish_reason": {"type": "length"}, "weight_version": "2"},
    )
    assert s.weight_versions == ["1"] and s.status is Sample.Status.PENDING
    s.append_response_tokens(
        _args(sglang_speculative_algorithm="EAGLE"),
        tokens=[],
        meta_info={
            "finish_reason": {"type": "length"},
            "weight_version": "2",
            "spec_verify_ct": 2,
            "completion_tokens": 5,
        },
    )
    assert s.weight_versions == ["1", "2"] and s.status is Sample.Status.TRUNCATED
    assert s.spec_info.spec_accept_length == 2.5 and s.tokens == [4, 5] and s.loss_mask == [1, 1]


def test_existing_response_without_mask_or_log_probs():
    s = Sample(tokens=[1, 2, 3], response_length=2)  # two earlier tokens, no mask, no log-probs
    s.append_response_tokens(None, tokens=[9], trainable=False)
    assert s.loss_mask == [1, 1, 0] and s.rollout_log_probs == [0.0, 0.0, 0.0]
    s2 = Sample(tokens=[1, 2, 3], response_length=2)
    with pytest.raises(ValueError, match="existing response tokens but no existing rollout_log_probs"):
        s2.append_response_tokens(None, tokens=[9], log_probs=[-1.0])


def test_lists_are_extended_in_place_like_slime():
    tokens, mask = [1], []
    s = Sample(tokens=tokens, loss_mask=mask)
    s.append_response_tokens(None, tokens=[2], trainable=False)
    assert tokens == [1, 2] and mask == [0] and s.tokens is tokens


def test_append_errors():
    with pytest.raises(ValueError, match="trainable response tokens require rollout log probabilities"):
        Sample().append_response_tokens(tokens=[10])
    with pytest.raises(ValueError, match="non-trainable response tokens should not pass rollout log probabilities"):
        Sample().append_response_tokens(tokens=[10], log_probs=[-0.1], trainable=False)
    with pytest.raises(ValueError, match="log_probs length 1 != tokens length 2"):
        Sample().append_response_tokens(tokens=[10, 11], log_probs=[-0.1])
    bad = Sample(tokens=[1, 2], response_length=1, loss_mask=[1, 1], rollout_log_probs=[0.0])
    with pytest.raises(ValueError, match="loss_mask length 3 != response_length 2"):
        bad.append_response_tokens(tokens=[3], log_probs=[-0.1])


def test_tensor_inputs_and_top_p_replay():
    s = Sample(
        tokens=[0, 1],
        response_length=1,
        loss_mask=[1],
        rollout_log_probs=[-0.3],
        rollout_top_p_token_ids=torch.tensor([1], dtype=torch.int32),
        rollout_top_p_token_offsets=torch.tensor([0, 1], dtype=torch.int32),
    )
    s.append_response_tokens(
        _args(),
        tokens=torch.tensor([10, 20]),
        log_probs=torch.tensor([-0.5, -0.25]),
        meta_info={
            "top_p_token_ids": _b64([10, 11, 20]),
            "top_p_token_offsets": _b64([0, 2, 3]),
            "finish_reason": {"type": "stop"},
        },
    )
    assert s.tokens == [0, 1, 10, 20] and s.rollout_log_probs == [-0.3, -0.5, -0.25]
    assert s.rollout_top_p_token_ids.tolist() == [1, 10, 11, 20]
    assert s.rollout_top_p_token_offsets.tolist() == [0, 1, 3, 4]
    s.append_response_tokens(_args(), tokens=[30, 31], trainable=False)  # tool tokens: empty spans
    assert s.rollout_top_p_token_offsets.tolist() == [0, 1, 3, 4, 4, 4]
    assert s.to_dict()["rollout_top_p_token_ids"] == [1, 10, 11, 20]
    with pytest.raises(ValueError, match="offsets length must equal generated token count"):
        Sample().append_response_tokens(
            _args(), tokens=[1], log_probs=[0.0], meta_info={"top_p_token_ids": [5], "top_p_token_offsets": [0, 1, 1]}
        )
    with pytest.raises(ValueError, match="must include both token ids and offsets"):
        Sample().append_response_tokens(_args(), tokens=[1], log_probs=[0.0], meta_info={"top_p_token_ids": [5]})


def test_routed_experts():
    s = Sample(tokens=[101, 102, 103])
    s.append_response_tokens(
        _args(), tokens=[], meta_info={"routed_experts": _b64(range(8)), "finish_reason": {"type": "stop"}}
    )
    assert s.rollout_routed_experts.tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    s.tokens.append(104)
    s.append_response_tokens(
        _args(), tokens=[], meta_info={"routed_experts": [8, 9, 10, 11], "routed_experts_start_len": 2}
    )
    assert s.rollout_routed_experts.tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [10, 11]]]
    with pytest.raises(ValueError, match="routed_experts element count does not match sample tokens"):
        Sample(tokens=[1, 2, 3]).append_response_tokens(_args(), tokens=[], meta_info={"routed_experts": [0] * 4})
    with pytest.raises(ValueError, match="args is required to decode routed experts"):
        Sample(tokens=[1, 2]).append_response_tokens(None, tokens=[], meta_info={"routed_experts": [0] * 4})


# ---------------------------------------------------------------- a search-r1-style plugin

# What a slime user writes (examples/search-r1 layout): the engine call goes through a module-level
# `post`, the sample is built turn by turn with `append_response_tokens`, retrieved text is appended
# with trainable=False. The test swaps `post` for a scripted SGLang.
post = None
SEARCH_R1_CONFIGS = {"max_turns": 2, "return_logprob": True}


async def search_generate(args, sample: Sample, sampling_params, tokenizer) -> Sample:
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    prompt_text = sample.prompt
    sample.tokens = list(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
    sample.loss_mask = []
    response = ""
    for _ in range(SEARCH_R1_CONFIGS["max_turns"]):
        output = await post(
            url, {"text": prompt_text + response, "sampling_params": sampling_params, "return_logprob": True}
        )
        if output["meta_info"]["finish_reason"]["type"] == "abort":
            sample.status = Sample.Status.ABORTED
            return sample
        pairs = output["meta_info"]["output_token_logprobs"]
        sample.append_response_tokens(
            args,
            tokens=[p[1] for p in pairs],
            log_probs=[p[0] for p in pairs],
            trainable=True,
            meta_info=output["meta_info"],
            text=output["text"],
        )
        response += output["text"]
        if output["meta_info"]["finish_reason"]["type"] == "length" or "<answer>" in output["text"]:
            break
        next_obs = "\n\n<information>Paris is the capital of France.</information>\n\n"
        obs_ids = tokenizer(next_obs, add_special_tokens=False)["input_ids"]
        sample.append_response_tokens(args, tokens=obs_ids, trainable=False, text=next_obs)
        response += next_obs
    return sample


def test_search_r1_style_plugin_builds_exact_sample(tiny_tokenizer, monkeypatch):
    tok = tiny_tokenizer
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    turns = ["<search>capital of France</search>", "<answer>Paris</answer>"]
    seen = []

    async def scripted_post(url, payload):
        seen.append((url, payload["text"]))
        k = len(seen) - 1
        t = ids(turns[k])
        return {
            "text": turns[k],
            "meta_info": {
                "output_token_logprobs": [[-0.25 * (i + 1), tid, None] for i, tid in enumerate(t)],
                "finish_reason": {"type": "stop"},
                "weight_version": str(7 + k),
                "prompt_tokens": 10 * (k + 1),
                "cached_tokens": 4 * k,
            },
        }

    monkeypatch.setattr(sys.modules[__name__], "post", scripted_post)
    args = _args(sglang_router_ip="127.0.0.1", sglang_router_port=30000, partial_rollout=False)
    prompt = "Question: what is the capital of France?\n"
    sample = asyncio.run(
        search_generate(args, Sample(index=0, group_index=0, prompt=prompt), {"max_new_tokens": 32}, tok)
    )

    obs = "\n\n<information>Paris is the capital of France.</information>\n\n"
    t1, t_obs, t2 = ids(turns[0]), ids(obs), ids(turns[1])
    assert seen == [
        ("http://127.0.0.1:30000/generate", prompt),
        ("http://127.0.0.1:30000/generate", prompt + turns[0] + obs),
    ]
    assert sample.tokens == ids(prompt) + t1 + t_obs + t2
    assert sample.response == turns[0] + obs + turns[1]
    assert sample.response_length == len(t1) + len(t_obs) + len(t2)
    assert sample.loss_mask == [1] * len(t1) + [0] * len(t_obs) + [1] * len(t2)
    assert sample.rollout_log_probs == (
        [-0.25 * (i + 1) for i in range(len(t1))] + [0.0] * len(t_obs) + [-0.25 * (i + 1) for i in range(len(t2))]
    )
    assert sample.weight_versions == ["7", "8"] and sample.status is Sample.Status.COMPLETED
    assert sample.prefix_cache_info.to_dict() == {"cached_tokens": 4, "total_prompt_tokens": 30}
    assert sample.effective_response_length == len(t1) + len(t2)
    # and the trainer batch carries the same tokens and masks
    sample.reward = 1.0
    batch = convert_samples_to_train_data(
        SimpleNamespace(advantage_estimator="grpo", reward_key=None, disable_rewards_normalization=True), [sample]
    )
    assert batch["tokens"] == [sample.tokens] and batch["loss_masks"] == [sample.loss_mask]
    assert batch["response_lengths"] == [sample.response_length]


# ---------------------------------------------------------------- debug files written by slime


def test_slime_written_debug_file_loads_and_round_trips(tmp_path, caplog):
    template = str(tmp_path / "rollout_{rollout_id}.pt")
    samples = [_slime_dict(index=i, future_field=i) for i in range(3)]
    samples[1]["rollout_routed_experts"] = torch.arange(8, dtype=torch.int32).reshape(1, 2, 4)
    torch.save({"rollout_id": 5, "samples": samples}, template.format(rollout_id=5))
    with caplog.at_level(logging.WARNING):
        loaded = load_debug_rollout(template, 5)
    assert [r.getMessage() for r in caplog.records] == [
        f"--load-debug-rollout-data: {tmp_path / 'rollout_5.pt'}: keeping unknown sample field(s) ['future_field'] "
        "in sample.extra_fields"
    ]
    assert [s.index for s in loaded] == [0, 1, 2] and [s.future_field for s in loaded] == [0, 1, 2]
    assert loaded[0].status is Sample.Status.TRUNCATED and loaded[0].train_metadata == {"loss_type": "sft"}
    assert loaded[1].rollout_routed_experts.tolist() == [[[0, 1, 2, 3], [4, 5, 6, 7]]]
    save_debug_rollout(template, 6, loaded)
    raw = torch.load(template.format(rollout_id=6), weights_only=True)
    assert raw["samples"][2] == {
        **samples[2],
        "rollout_top_p_token_ids": [7, 9, 8],
        "rollout_top_p_token_offsets": [0, 2, 3],
    }
    assert raw["samples"][1]["rollout_routed_experts"] == [[[0, 1, 2, 3], [4, 5, 6, 7]]]
