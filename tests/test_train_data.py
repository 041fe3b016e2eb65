"""Samples -> training batch: slime's full key set, rollout ids and mask sums, slime's loss-mask rules,
raw_reward override, and the two custom hooks (good and wrong shapes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slime.rollout.controller import BatchError, assign_rollout_ids, convert_samples_to_train_data
from slime.utils.misc import PluginLoadError
from slime.utils.types import Sample


def _args(**kw):
    base = dict(advantage_estimator="grpo", disable_rewards_normalization=True, reward_key=None)
    return SimpleNamespace(**{**base, **kw})


def _sample(idx, group, reward=1.0, prompt=(1, 2), response=(10, 11), mask="ones", **fields):
    s = Sample(
        group_index=group,
        index=idx,
        tokens=list(prompt) + list(response),
        response_length=len(response),
        reward=reward,
        loss_mask=[1] * len(response) if mask == "ones" else mask,
        status=Sample.Status.COMPLETED,
    )
    for k, v in fields.items():
        setattr(s, k, v)
    return s


def test_rollout_ids_fresh_ids_never_collide():
    assert assign_rollout_ids([5, None, 5, None, 0, 1]) == [5, 2, 5, 3, 0, 1]
    assert assign_rollout_ids([None, None]) == [0, 1]
    samples = [_sample(0, 0, rollout_id=5), _sample(1, 0), _sample(2, 1, rollout_id=5), _sample(3, 1)]
    assert convert_samples_to_train_data(_args(), samples)["rollout_ids"] == [5, 0, 5, 1]


def test_rollout_mask_sums_are_per_rollout_totals():
    samples = [
        _sample(0, 0, response=(10, 11, 12), mask=[1, 0, 1], rollout_id=7),
        _sample(1, 0, response=(10, 11), mask=[1, 1], rollout_id=7),
        _sample(2, 1, response=(10,), mask=[1], rollout_id=3),
        _sample(3, 1, response=(10, 11), mask=[0, 1]),
    ]  # its own rollout
    b = convert_samples_to_train_data(_args(), samples)
    assert b["rollout_ids"] == [7, 7, 3, 0]
    assert b["rollout_mask_sums"] == [4, 4, 1, 1]
    assert b["total_lengths"] == [5, 4, 3, 4]
    assert b["response_lengths"] == [3, 2, 1, 2]


def test_loss_mask_none_is_ones_and_remove_sample_is_zeros():
    a = _sample(0, 0, response=(10, 11, 12), mask=None)
    r = _sample(1, 0, response=(10, 11), mask=[1, 1], remove_sample=True)
    rn = _sample(2, 0, response=(10,), mask=None, remove_sample=True)
    b = convert_samples_to_train_data(_args(), [a, r, rn])
    assert b["loss_masks"] == [[1, 1, 1], [0, 0], [0]]
    assert b["rollout_mask_sums"] == [3, 0, 0]
    assert a.loss_mask is None and r.loss_mask == [1, 1]  # conversion never mutates a sample


def test_raw_reward_override_from_metadata_and_rewards_from_reward():
    samples = [_sample(0, 0, reward=1.0), _sample(1, 0, reward=0.0), _sample(2, 0, reward=0.5)]
    samples[1].metadata = {"raw_reward": 0.25}
    b = convert_samples_to_train_data(_args(), samples)
    assert b["raw_reward"] == [1.0, 0.25, 0.5]
    assert b["rewards"] == [1.0, 0.0, 0.5]  # training rewards still from sample.reward


def test_full_key_set_when_samples_carry_it():
    s0 = _sample(
        0,
        0,
        rollout_log_probs=[-0.5, -0.25],
        teacher_log_probs=[-1.0, -2.0],
        train_metadata={"loss": "sft"},
        multimodal_train_inputs={"pixel_values": [[0.0]]},
        weight_versions=["3"],
    )
    s1 = _sample(1, 0, rollout_log_probs=[-0.1, -0.2], teacher_log_probs=[-3.0, -4.0], weight_versions=["3", "4"])
    s0.metadata = {"source_name": "math", "round_number": 2}
    s1.metadata = {"round_number": 3}
    s1.status = Sample.Status.TRUNCATED
    b = convert_samples_to_train_data(_args(), [s0, s1])
    assert b["rollout_log_probs"] == [[-0.5, -0.25], [-0.1, -0.2]]
    assert b["teacher_log_probs"] == [[-1.0, -2.0], [-3.0, -4.0]]
    assert b["metadata"] == [{"loss": "sft"}, None]
    assert b["multimodal_train_inputs"] == [{"pixel_values": [[0.0]]}, None]
    assert b["source_names"] == ["math", "unknown"]
    assert b["weight_versions"] == [["3"], ["3", "4"]]
    assert b["round_number"] == [2, 3] and b["truncated"] == [0, 1] and b["sample_indices"] == [0, 1]
    assert b["tokens"] == [[1, 2, 10, 11], [1, 2, 10, 11]]


def test_optional_keys_absent_when_samples_lack_them():
    b = convert_samples_to_train_data(_args(), [_sample(0, 0), _sample(1, 0)])
    for key in (
        "rollout_log_probs",
        "teacher_log_probs",
        "metadata",
        "multimodal_train_inputs",
        "source_names",
        "round_number",
        "rollout_routed_experts",
    ):
        assert key not in b
    assert b["weight_versions"] == [[], []]


def test_per_sample_checks_name_the_sample():
    bad = _sample(4, 2, teacher_log_probs=[-1.0])
    with pytest.raises(
        BatchError, match="sample index=4 group=2: teacher_log_probs has 1 entries, response_length is 2"
    ):
        convert_samples_to_train_data(_args(), [bad])
    bad = _sample(5, 2, mask=[1, 1, 1])
    with pytest.raises(BatchError, match="sample index=5 group=2: loss_mask has 3 entries"):
        convert_samples_to_train_data(_args(), [bad])
    with pytest.raises(BatchError, match="no samples"):
        convert_samples_to_train_data(_args(), [])


def test_reward_post_process_hook():
    args = _args(custom_reward_post_process_path="tests.plugins.train_data_hooks.rewards_times_ten")
    b = convert_samples_to_train_data(args, [_sample(0, 0, reward=1.0), _sample(1, 0, reward=0.5)])
    assert b["rewards"] == [10.0, 5.0] and b["raw_reward"] == [1.0, 0.5]


def test_reward_hook_returning_one_flat_list_is_not_a_pair():
    args = _args(custom_reward_post_process_path="tests.plugins.train_data_hooks.rewards_one_list")
    with pytest.raises(BatchError, match="--custom-reward-post-process-path"):  # three floats, not a pair at all
        convert_samples_to_train_data(args, [_sample(0, 0), _sample(1, 0), _sample(2, 0)])


def test_convert_hook_output_is_completed():
    args = _args(custom_convert_samples_to_train_data_path="tests.plugins.train_data_hooks.convert_minimal")
    samples = [_sample(0, 0, rollout_id=4), _sample(1, 0, rollout_id=4), _sample(2, 1, response=(9,))]
    b = convert_samples_to_train_data(args, samples)
    assert b["rewards"] == [7.0, 7.0, 7.0] and b["raw_reward"] == [7.0, 7.0, 7.0]
    assert b["rollout_ids"] == [4, 4, 0] and b["rollout_mask_sums"] == [4, 4, 1]
    assert b["total_lengths"] == [4, 4, 3]


REWARD_HOOK, CONVERT_HOOK = "custom_reward_post_process_path", "custom_convert_samples_to_train_data_path"


@pytest.mark.parametrize(
    "flag, hook, message",
    [
        # two samples: a flat list of two floats looks like a pair, but its entries are not lists
        (
            REWARD_HOOK,
            "rewards_one_list",
            r"--custom-reward-post-process-path '.*rewards_one_list' returned raw_rewards "
            r"as float; expected \(raw_rewards, rewards\), each a list of 2",
        ),
        (
            REWARD_HOOK,
            "rewards_short",
            r"--custom-reward-post-process-path '.*rewards_short' returned raw_rewards with "
            r"1 entries for 2 samples",
        ),
        (
            CONVERT_HOOK,
            "convert_to_list",
            r"--custom-convert-samples-to-train-data-path '.*convert_to_list' returned "
            r"list; expected a dict",
        ),
        (
            CONVERT_HOOK,
            "convert_bad_mask",
            r"--custom-convert-samples-to-train-data-path '.*convert_bad_mask': entry 1: "
            r"loss_masks has 1 entries, response_length is 2",
        ),
    ],
)
def test_hook_with_wrong_shape_names_the_flag(flag, hook, message):
    args = _args(**{flag: f"tests.plugins.train_data_hooks.{hook}"})
    with pytest.raises(BatchError, match=message):
        convert_samples_to_train_data(args, [_sample(0, 0), _sample(1, 0)])


def test_unknown_hook_path_names_the_flag():
    args = _args(custom_convert_samples_to_train_data_path="tests.plugins.train_data_hooks.nope")
    with pytest.raises(PluginLoadError, match="--custom-convert-samples-to-train-data-path"):
        convert_samples_to_train_data(args, [_sample(0, 0)])
