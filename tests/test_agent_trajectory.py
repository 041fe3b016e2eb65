"""What the project adds to slime's trajectory manager (slime's 35 branching tests run in
`../shared/upstream`): each trained span is one segment with the weight version that sampled it,
a span healed by REALIGN stops being one, truncation clips them, and statuses follow the finish."""

from __future__ import annotations

from slime.agent.gateway.records import TurnRecord
from slime.agent.gateway.trajectory import TrajectoryManager
from slime.utils.types import Sample

SYS, USER, TOOL = {"role": "system", "content": "S"}, {"role": "user", "content": "u"}, {"role": "tool", "content": "t"}


def answer(text: str) -> dict:
    return {"role": "assistant", "content": text}


def record(mgr, prompt, out, messages, reply, *, version, finish="stop"):
    mgr.record_turn(
        "s",
        turn=TurnRecord(prompt, out, finish, [-0.5] * len(out), weight_version=version),
        prompt_messages=messages,
        response_message=answer(reply),
    )


def test_each_trained_span_is_a_segment_with_the_weight_version_that_sampled_it():
    mgr = TrajectoryManager()
    p1 = [1, 2, 3]
    record(mgr, p1, [10, 11], [SYS, USER], "a", version="7")
    p2 = p1 + [10, 11] + [20, 21]
    record(mgr, p2, [12], [SYS, USER, answer("a"), TOOL], "b", version="8")
    [s] = mgr.get_trajectory("s", base_sample=Sample(index=4, group_index=2, prompt="q"), reward=0.5)
    assert s.tokens == p2 + [12] and s.loss_mask == [1, 1, 0, 0, 1]
    assert s.rollout_log_probs == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert s.weight_versions == ["7", "8"]
    assert s.metadata["segments"] == [{"start": 0, "end": 2, "rollout_id": 4}, {"start": 4, "end": 5, "rollout_id": 4}]
    assert (s.index, s.group_index, s.reward, s.status) == (4, 2, 0.5, Sample.Status.COMPLETED)


def test_a_realigned_answer_is_context_and_no_longer_a_segment():
    mgr = TrajectoryManager()
    p1 = [1, 2, 3]
    record(mgr, p1, [10, 11], [SYS, USER], "a", version="7")
    p2 = p1 + [10, 99] + [20]  # the client's replay re-tokenised our answer's last id
    record(mgr, p2, [12], [SYS, USER, answer("a"), TOOL], "b", version="8")
    [s] = mgr.get_trajectory("s", base_sample=Sample(index=0, prompt=""))
    assert s.tokens == p2 + [12] and s.loss_mask == [0, 0, 0, 1]
    assert s.weight_versions == ["8"]
    assert s.metadata["segments"] == [{"start": 3, "end": 4, "rollout_id": 0}]


def test_max_sample_tokens_clips_tokens_and_segments_and_length_finish_truncates():
    mgr = TrajectoryManager()
    record(mgr, [1, 2], [10, 11, 12, 13], [USER], "a", version="3", finish="length")
    [s] = mgr.get_trajectory("s", base_sample=Sample(index=0, prompt=""), max_sample_tokens=4)
    assert s.tokens == [1, 2, 10, 11] and s.loss_mask == [1, 1] and s.response_length == 2
    assert s.metadata["segments"] == [{"start": 0, "end": 2, "rollout_id": 0}]
    assert s.status == Sample.Status.TRUNCATED and s.metadata["truncated"] is True
