"""On-policy distillation pieces without a cluster: slime's OPD penalty on advantages, the teacher's
answer turned into `teacher_log_probs`, and their way into the training batch."""

from __future__ import annotations

import math
from argparse import Namespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.rollout.controller import convert_samples_to_train_data
from slime.rollout.on_policy_distillation import (
    TeacherAnswerError,
    post_process_rewards,
    reward_func,
    teacher_log_probs,
    teacher_request,
)
from slime.cli.finalize import complete_namespace
from slime.train.flags import LossConfig
from slime.train.loss import LossConfigError, apply_opd_kl_to_advantages, check_loss_args
from slime.utils.types import Sample

POST_PROCESS = "slime.rollout.on_policy_distillation.post_process_rewards"


def teacher_answer(tokens: list[int], logprobs: list[float]) -> dict:
    """An SGLang /generate answer scoring `tokens` from position 0 (first entry None)."""
    entries = [[None, tokens[0], None]] + [[lp, t, None] for lp, t in zip(logprobs, tokens[1:])]
    return {"text": "", "output_ids": [], "meta_info": {"input_token_logprobs": entries, "output_token_logprobs": []}}


def sample(index: int, tokens: list[int], response_length: int, reward=None) -> Sample:
    return Sample(
        group_index=index // 2,
        index=index,
        tokens=tokens,
        response_length=response_length,
        rollout_log_probs=[-0.5] * response_length,
        reward=reward,
        status=Sample.Status.COMPLETED,
    )


def test_the_penalty_subtracts_the_scaled_reverse_kl_from_each_tokens_advantage():
    advantages = [torch.tensor([1.0, 1.0, 1.0]), torch.tensor([-2.0])]
    student = [torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-0.25])]
    teacher = [torch.tensor([-1.5, -1.0, -3.0]), torch.tensor([-0.75])]
    kls = apply_opd_kl_to_advantages(Namespace(opd_kl_coef=0.5), advantages, student, teacher)
    assert [k.tolist() for k in kls] == [[0.5, -1.0, 0.0], [0.5]]
    assert [a.tolist() for a in advantages] == [[0.75, 1.5, 1.0], [-2.25]]


def test_the_penalty_without_teacher_log_probs_names_the_recipe():
    with pytest.raises(LossConfigError, match="--use-opd needs teacher_log_probs.*on_policy_distillation.reward_func"):
        apply_opd_kl_to_advantages(Namespace(opd_kl_coef=1.0), [torch.zeros(2)], [torch.zeros(2)], None)


def test_the_reference_trainer_takes_the_sglang_teacher_only():
    check_loss_args(LossConfig.from_args(complete_namespace(Namespace(use_opd=True, opd_type="sglang"))))
    with pytest.raises(LossConfigError, match="--opd-type megatron"):
        check_loss_args(LossConfig.from_args(complete_namespace(Namespace(use_opd=True, opd_type="megatron"))))


def test_the_teacher_request_scores_the_samples_own_tokens_without_sampling():
    s = sample(0, [5, 6, 7, 8], 2)
    body = teacher_request(Namespace(rollout_temperature=0.7), s)
    assert body == {
        "input_ids": [5, 6, 7, 8],
        "return_logprob": True,
        "logprob_start_len": 0,
        "sampling_params": {"temperature": 0.7, "max_new_tokens": 0, "skip_special_tokens": False},
    }


async def test_reward_func_without_rm_url_names_the_flag():
    with pytest.raises(ValueError, match="--rm-url"):
        await reward_func(Namespace(rm_url=None), sample(0, [1, 2], 1))


def test_teacher_log_probs_are_the_response_part_of_the_answer():
    s = sample(0, [11, 12, 13, 14, 15], 2)
    assert teacher_log_probs(s, teacher_answer(s.tokens, [-0.1, -0.2, -0.3, -0.4])) == [-0.3, -0.4]
    empty = sample(1, [11, 12], 0)
    assert teacher_log_probs(empty, teacher_answer(empty.tokens, [-0.1])) == []


@pytest.mark.parametrize(
    "answer, message",
    [
        (0.0, "not a teacher answer.*--rm-url"),
        ({"meta_info": {}}, "not a teacher answer"),
        (teacher_answer([11, 12, 13, 99, 15], [-0.1, -0.2, -0.3, -0.4]), "other token ids"),
        (teacher_answer([13, 14, 15], [-0.3, -0.4]), "scored 3 tokens, the sample has 5"),
    ],
)
def test_a_wrong_teacher_answer_is_an_error_naming_the_sample(answer, message):
    with pytest.raises(TeacherAnswerError, match=f"sample index=0 group=0: .*{message}"):
        teacher_log_probs(sample(0, [11, 12, 13, 14, 15], 2), answer)


@pytest.mark.parametrize("bad", [float("nan"), float("-inf"), 0.5, None, "x", True])
def test_a_teacher_log_prob_that_is_not_finite_and_at_most_0_is_refused(bad):
    answer = teacher_answer([11, 12, 13, 14, 15], [-0.1, -0.2, -0.3, -0.4])
    answer["meta_info"]["input_token_logprobs"][4][0] = bad
    with pytest.raises(TeacherAnswerError, match="sample index=0 group=0: input_token_logprobs item 4 is not"):
        teacher_log_probs(sample(0, [11, 12, 13, 14, 15], 2), answer)


@settings(max_examples=300, deadline=None)
@given(
    entries=st.lists(
        st.one_of(
            st.none(),
            st.integers(),
            st.floats(),
            st.text(max_size=3),
            st.lists(
                st.one_of(st.none(), st.booleans(), st.integers(-2, 20), st.floats(), st.text(max_size=2)), max_size=3
            ),
        ),
        max_size=6,
    )
)
def test_any_teacher_answer_gives_checked_log_probs_or_a_teacher_answer_error(entries):
    s = sample(0, [11, 12, 13, 14, 15], 2)
    try:
        lps = teacher_log_probs(s, {"meta_info": {"input_token_logprobs": entries}})
    except TeacherAnswerError:
        return
    assert len(lps) == 2 and all(math.isfinite(lp) and lp <= 1e-4 for lp in lps)


def test_a_response_without_a_prompt_has_no_teacher_log_prob_for_its_first_token():
    with pytest.raises(TeacherAnswerError, match="no prompt token"):
        teacher_log_probs(sample(0, [11, 12], 2), teacher_answer([11, 12], [-0.1]))


def test_teacher_log_probs_reach_the_batch_and_rewards_are_zero():
    samples = [sample(i, [1, 2, 3 + i, 4 + i], 2) for i in range(4)]
    for i, s in enumerate(samples):
        s.reward = teacher_answer(s.tokens, [-0.1, -0.2 - i, -0.3 - i])
    args = Namespace(
        custom_reward_post_process_path=POST_PROCESS,
        custom_convert_samples_to_train_data_path=None,
        advantage_estimator="grpo",
    )
    batch = convert_samples_to_train_data(args, samples)
    assert batch["teacher_log_probs"] == [pytest.approx([-0.2 - i, -0.3 - i]) for i in range(4)]
    assert batch["rewards"] == [0.0] * 4 and batch["raw_reward"] == [0.0] * 4
    assert post_process_rewards(args, samples) == ([0.0] * 4, [0.0] * 4)


def test_slime_train_refuses_a_megatron_teacher_before_anything_starts(tiny_model_dir, tmp_path):
    from slime.cli.args import ArgError
    from slime.cli.train import parse_train_args

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "hi", "label": ""}\n')
    with pytest.raises(ArgError, match="--opd-type megatron: the reference trainer"):
        parse_train_args(
            [
                "--rollout-backend",
                "hf",
                "--hf-checkpoint",
                str(tiny_model_dir),
                "--prompt-data",
                str(data),
                "--use-opd",
                "--opd-type",
                "megatron",
                "--opd-teacher-load",
                str(tmp_path),
            ]
        )
