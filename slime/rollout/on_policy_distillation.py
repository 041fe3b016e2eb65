"""On-policy distillation with a teacher served over SGLang's HTTP protocol (slime's `--opd-type sglang`).

    --custom-rm-path slime.rollout.on_policy_distillation.reward_func
    --custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards
    --rm-url http://TEACHER/generate  --use-opd --opd-type sglang --opd-kl-coef 1.0

`reward_func` sends the sample's exact token ids (prompt + response, never re-tokenized) to the
teacher with `max_new_tokens: 0, logprob_start_len: 0` and keeps the teacher's whole answer as the
sample's reward. `post_process_rewards` takes the response part of the teacher's
`meta_info.input_token_logprobs` into `sample.teacher_log_probs` (the batch key `teacher_log_probs`)
and returns zero task rewards, as slime does: the learning signal is the trainer's OPD penalty
(`slime.train.loss.apply_opd_kl_to_advantages`). Any engine that answers `input_token_logprobs` works
as the teacher, our embedded one included.
"""

from __future__ import annotations

import math
from typing import Any

from slime.rollout.engine_answer import LOGPROB_TOLERANCE
from slime.utils import http_retry
from slime.utils.types import Sample
from slime.utils.plugin_args import completed

RM_URL_FLAG = "--rm-url"
TEACHER_TIMEOUT = 300.0  # seconds per attempt (a long sequence on a busy teacher); retries on top, budgeted


class TeacherAnswerError(ValueError):
    """The teacher's answer cannot give this sample's teacher log-probs; the message names the sample."""


def teacher_request(args: Any, sample: Sample) -> dict[str, Any]:
    """The `/generate` body that scores `sample.tokens` without sampling anything."""
    return {
        "input_ids": list(sample.tokens),
        "sampling_params": {"temperature": args.rollout_temperature, "max_new_tokens": 0, "skip_special_tokens": False},
        "return_logprob": True,
        "logprob_start_len": 0,
    }


async def reward_func(args: Any, sample: Sample, **kwargs: Any) -> dict[str, Any]:
    """slime's OPD reward: the teacher's `/generate` answer for the sample's tokens, kept whole."""
    args = completed(args)
    url = args.rm_url
    if not url:
        raise ValueError(
            f"{RM_URL_FLAG} is required by slime.rollout.on_policy_distillation.reward_func "
            f"(the teacher's /generate URL)"
        )
    from slime.rollout.runtime import bound

    runtime = bound()
    if runtime is not None:  # the controller's session, deadline, retry budget and counters
        return await runtime.client.post(url, teacher_request(args, sample), timeout=TEACHER_TIMEOUT)
    return await http_retry.post(
        url, teacher_request(args, sample), timeout=TEACHER_TIMEOUT, policy=http_retry.RetryPolicy()
    )


def teacher_log_probs(sample: Sample, answer: Any) -> list[float]:
    """The teacher's log-probs of the sample's response tokens, checked against the sample's own ids
    (a teacher that scored other tokens would silently train on a wrong signal)."""
    who = f"sample index={sample.index} group={sample.group_index}"
    entries = answer.get("meta_info", {}).get("input_token_logprobs") if isinstance(answer, dict) else None
    if not isinstance(entries, list):
        raise TeacherAnswerError(
            f"{who}: the reward is not a teacher answer with meta_info.input_token_logprobs "
            f"(is {RM_URL_FLAG} an SGLang /generate URL, and --custom-rm-path "
            f"slime.rollout.on_policy_distillation.reward_func?)"
        )
    n = sample.response_length
    if len(entries) != len(sample.tokens):
        raise TeacherAnswerError(
            f"{who}: the teacher scored {len(entries)} tokens, the sample has {len(sample.tokens)} (prompt + response)"
        )
    tail = entries[len(entries) - n :] if n else []
    if n and len(entries) == n:  # the first entry is None in SGLang: a response needs a prompt before it
        raise TeacherAnswerError(f"{who}: no prompt token before the response, its first token has no teacher log-prob")
    for i, entry in enumerate(tail, start=len(entries) - n):
        if not _is_entry(entry):
            raise TeacherAnswerError(
                f"{who}: input_token_logprobs item {i} is not [finite log-prob <= 0 "
                f"(+{LOGPROB_TOLERANCE}), token id]: {str(entry)[:80]}"
            )
    if [e[1] for e in tail] != list(sample.tokens[len(sample.tokens) - n :]):
        raise TeacherAnswerError(
            f"{who}: the teacher's input_token_logprobs name other token ids than the sample's response"
        )
    return [float(e[0]) for e in tail]


def _is_entry(entry: Any) -> bool:
    """SGLang's `[log-prob, token id, ...]`, with the same rule as a /generate answer's log-probs."""
    if not isinstance(entry, (list, tuple)) or len(entry) < 2:
        return False
    lp, tid = entry[0], entry[1]
    return (
        isinstance(tid, int)
        and not isinstance(tid, bool)
        and isinstance(lp, (int, float))
        and not isinstance(lp, bool)
        and math.isfinite(lp)
        and lp <= LOGPROB_TOLERANCE
    )


def post_process_rewards(args: Any, samples: list[Sample], **kwargs: Any) -> tuple[list[float], list[float]]:
    """slime's OPD post-process: `sample.teacher_log_probs` from each teacher answer, and zero task
    rewards as both raw and training rewards (pure distillation; the OPD penalty carries the signal)."""
    args = completed(args)
    for sample in samples:
        sample.teacher_log_probs = teacher_log_probs(sample, sample.reward)
    zeros = [0.0] * len(samples)
    return zeros, list(zeros)
