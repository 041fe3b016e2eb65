"""Partial rollout: a sample interrupted by an abort keeps what it sampled and is continued later.

Long responses dominate a synchronous rollout. When a rollout has its target it aborts the rest; with
`--partial-rollout` the engines' abort answers (the tokens sampled so far, finish reason "abort") are
kept, the group goes back to the buffer, and a later rollout continues it instead of starting over.

The contract the rollout functions share (`sglang_rollout`, `fully_async_rollout`):
- `generate_and_rm_group(args, group, params, runtime=...)` continues every sample whose status is
  ABORTED with `response_length > 0` with `--partial-rollout`: input = its `tokens` (prompt +
  partial response), `max_new_tokens` = the budget minus what it generated. A sample that already
  finished (COMPLETED/TRUNCATED with a response) is returned as it is, reward kept (with --group-rm
  the group is rewarded again as a whole, as a group RM needs).
- A group whose samples come back ABORTED keeps their partial tokens, log-probs and loss mask;
  `keep_partial_group` prepares such a group for the buffer (whole groups only: a group is never split
  between rollouts). Without `--partial-rollout`, `reset_group` returns it to its prompt (the tokens are
  wasted, and counted).
- Every engine answer is one *segment*, recorded on every path by `Sample.append_segment` /
  `Sample.record_segment` (`slime/utils/types.py`): its weight version and response span. Here
  `metadata["continuations"]` counts the times a sample was continued, `metadata["start_rollout_id"]` is
  the rollout in which it was first interrupted (slime's key).
- `--mask-offpolicy-in-partial-rollout`: `mask_offpolicy` sets the loss mask to 0 on the segments
  sampled by another weight version than the one that finished the sample (when engines report no
  versions: every segment of an earlier rollout, which is slime's rule).
- While a rollout aborts, the engine client's `gate` is closed: our generate functions send no new request
  and report the sample ABORTED at once, so a multi-turn sample whose tool call was in flight stops at that
  turn.

A custom generate function declares it can continue a sample with `supports_partial_rollout = True`.
"""

from __future__ import annotations

import copy
from typing import Any

from slime.rollout.flags import RolloutConfig
from slime.utils.types import Sample

FINISHED = (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
SUPPORTS_ATTR = "supports_partial_rollout"


# ---- declaration -------------------------------------------------------------------------------
def supports_partial_rollout(fn: Any) -> bool:
    return bool(getattr(fn, SUPPORTS_ATTR, False))


def check_generate_function(config: RolloutConfig) -> None:
    """`--partial-rollout` needs a generate function that can continue a sample; ValueError otherwise."""
    path = config.custom_generate_function_path
    if not config.partial_rollout or not path:
        return
    from slime.utils.misc import load_function

    fn = load_function(path, "--custom-generate-function-path")
    if not supports_partial_rollout(fn):
        raise ValueError(
            f"--partial-rollout: --custom-generate-function-path {path!r} cannot continue an aborted sample "
            f"(it does not declare `{SUPPORTS_ATTR} = True`). Continue from `sample.tokens` with the remaining "
            f"budget and set `{path.rsplit('.', 1)[-1]}.{SUPPORTS_ATTR} = True`, or drop --partial-rollout"
        )


# ---- one sample --------------------------------------------------------------------------------
def is_finished(sample: Sample) -> bool:
    """(With --partial-rollout) a sample returned to the buffer already finished (its group was interrupted):
    not regenerated."""
    return sample.status in FINISHED and sample.response_length > 0


def continuation_input(sample: Sample, params: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
    """(input ids, sampling params) that continue `sample`: prompt + partial response, remaining budget."""
    params = dict(params)
    params["max_new_tokens"] = int(params["max_new_tokens"]) - sample.response_length
    return list(sample.tokens), params


def token_weight_versions(sample: Sample) -> list[str | None]:
    """The weight version of every response token (None: not sampled, e.g. tool output, or unknown)."""
    versions: list[str | None] = [None] * sample.response_length
    for v, seg in zip(sample.metadata.get("weight_versions", []), sample.metadata.get("segments", [])):
        versions[seg["start"] : seg["end"]] = [v] * (seg["end"] - seg["start"])
    return versions


def mask_offpolicy(sample: Sample) -> int:
    """Loss mask 0 on the segments sampled by another policy than the one that finished the sample;
    returns how many tokens it masked. Policies are told apart by weight version, or by rollout id
    when the engines report no version."""
    versions, segments = sample.metadata.get("weight_versions") or [], sample.metadata.get("segments") or []
    if len(segments) < 2 or sample.loss_mask is None:
        return 0

    def policy(i: int) -> Any:
        return versions[i] if versions[i] is not None else ("rollout", segments[i].get("rollout_id"))

    final, masked = policy(len(segments) - 1), 0
    for i, seg in enumerate(segments[:-1]):
        if policy(i) != final:
            for p in range(seg["start"], min(seg["end"], len(sample.loss_mask))):
                masked += sample.loss_mask[p]
                sample.loss_mask[p] = 0
    return masked


# ---- one group ---------------------------------------------------------------------------------
def unfinished(group: list[Sample]) -> int:
    return sum(s.status == Sample.Status.ABORTED for s in group)


def keep_partial_group(group: list[Sample], rollout_id: int | None) -> list[Sample]:
    """A group interrupted by an abort, ready for the buffer: finished samples as they are (reward
    kept), unfinished ones ABORTED with their partial response; `start_rollout_id` set once."""
    for s in group:
        if s.status not in FINISHED and s.status != Sample.Status.FAILED:
            s.status = Sample.Status.ABORTED
        if s.response_length and "start_rollout_id" not in s.metadata:
            s.metadata["start_rollout_id"] = rollout_id
    return group


def reset_sample(sample: Sample) -> int:
    """Back to a fresh prompt; returns the response tokens thrown away."""
    wasted = sample.response_length
    prompt = sample.tokens[: sample.prompt_length] if sample.response_length else sample.tokens
    sample.start_response(prompt)
    sample.loss_mask = sample.rollout_log_probs = None
    sample.reward, sample.status = None, Sample.Status.PENDING
    sample.metadata.pop("finish_reason", None)
    return wasted


def reset_group(group: list[Sample]) -> int:
    return sum(reset_sample(s) for s in group)


def snapshot(group: list[Sample]) -> list[Sample] | None:
    """The group as a rollout took it, to put back if its generation is cancelled; None for a group of
    fresh prompts (resetting it restores it, so nothing is copied in the common case)."""
    if all(s.response_length == 0 for s in group):
        return None
    return [_copy(s) for s in group]


def _copy(sample: Sample) -> Sample:
    """A copy that shares nothing mutable with `sample` (lists copied at C speed, metadata deep)."""
    c = copy.copy(sample)
    c.tokens, c.weight_versions = list(sample.tokens), list(sample.weight_versions)
    c.loss_mask = None if sample.loss_mask is None else list(sample.loss_mask)
    c.rollout_log_probs = None if sample.rollout_log_probs is None else list(sample.rollout_log_probs)
    c.metadata = copy.deepcopy(sample.metadata)
    return c


def restore(group: list[Sample], before: list[Sample] | None) -> tuple[list[Sample], int]:
    """(`group` as it was handed out, the response tokens it generated since then, thrown away)."""
    if before is None:
        return group, reset_group(group)
    return before, sum(max(0, s.response_length - b.response_length) for s, b in zip(group, before))
