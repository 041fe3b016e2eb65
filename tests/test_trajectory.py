"""The typed trajectory record: one type written by the tool loop, read by metrics, dumps and the viewer.

The end-to-end test runs the real multi-turn loop against a scripted engine behind the real
sglang-router, with a tool that raises and a malformed tool call, and follows the error records
to the dashboard counts, the JSONL dump and the viewer.
"""

from __future__ import annotations

import io
import json
import re

import pytest
import torch

from rollout_plugins.multi_turn import generate
from slime.observability import viewer_data as V
from slime.observability.flags import ReportConfig
from slime.observability.metrics import compute_rollout_metrics
from slime.observability.rollout_dump import dump_rollout, validate_line
from slime.utils.trajectory import (
    VERSION_KEY,
    ParseErrorRecord,
    StepReward,
    ToolErrorRecord,
    ToolMessage,
    TrajectoryRecord,
    TurnSpan,
)
from slime.utils.types import Sample
from tests.test_multi_turn import CASES, PARAMS, call, make_args, sample_for, say, stack, tok  # noqa: F401 fixtures

MALFORMED = '<tool_call>\n{"name": "calculator", "arguments": {"expression": }\n</tool_call>'


def full_record() -> TrajectoryRecord:
    return TrajectoryRecord(
        turns=2,
        finish_reason="no_tool_call",
        non_generation_time=0.5,
        template_drift=False,
        turn_spans=[
            TurnSpan(turn=1, role="assistant", start=0, end=5),
            TurnSpan(turn=1, role="tool", start=5, end=9),
            TurnSpan(turn=2, role="assistant", start=9, end=12),
        ],
        tool_messages=[
            ToolMessage(
                turn=1, name="calculator", arguments={"expression": "3+4"}, response="7", executed=True, truncated=True
            ),
            ToolMessage(turn=1, error="the tool call is not valid JSON"),
        ],
        tool_errors=[ToolErrorRecord(turn=None, tool="calculator", kind="release", message="gone")],
        parse_errors=[ParseErrorRecord(turn=1, kind="malformed_json", message="not JSON", raw="{")],
        step_rewards=[StepReward(turn=1, tool="calculator", reward=0.25)],
        tool_rewards={"calculator": 1.0},
    )


# ---- the record on its own -------------------------------------------------------------------
def test_store_writes_builtins_under_slime_keys_and_reads_back():
    s = Sample(index=4, metadata={"tools_kwargs": {"calculator": {}}, "dropped_tool_tokens": 99})
    full_record().store(s)
    md = s.metadata
    assert md["tools_kwargs"] == {"calculator": {}} and "dropped_tool_tokens" not in md  # stale key replaced
    assert md["turns"] == md["round_number"] == 2 and md["finish_reason"] == "no_tool_call"
    assert md["tool_calls"] == {"calculator": 1} and md["truncated_tool_responses"] == 1
    assert md["tool_reward_total"] == 1.25 and md[VERSION_KEY] == 1
    assert md["tool_errors"] == [{"turn": None, "tool": "calculator", "kind": "release", "message": "gone"}]
    assert "error" not in md and "outcome_reward" not in md  # unset optional fields are left out
    # Sample.to_dict stays loadable with weights_only=True, and reads back to the same record
    buf = io.BytesIO()
    torch.save(s.to_dict(), buf)
    buf.seek(0)
    loaded = Sample.from_dict(torch.load(buf, weights_only=True))
    assert TrajectoryRecord.of(loaded) == full_record()


def test_derived_values_are_recomputed_not_trusted():
    s = Sample(index=0)
    full_record().store(s)
    s.metadata.update(tool_calls={"calculator": 40}, round_number=7, tool_reward_total=-1.0)
    rec = TrajectoryRecord.of(s)
    assert (rec.tool_calls, rec.round_number, rec.tool_reward_total) == ({"calculator": 1}, 2, 1.25)


def test_samples_without_a_record_and_bad_records():
    single = Sample(index=1, metadata={"finish_reason": "stop", "turns": 1})  # not written by a tool loop
    assert TrajectoryRecord.of(single) is None and TrajectoryRecord.of(Sample()) is None
    s = Sample(index=7)
    full_record().store(s)
    s.metadata["tool_errors"] = 2  # a count where records belong: the disagreement this type prevents
    with pytest.raises(
        ValueError,
        match=r"sample 7: metadata does not hold a valid trajectory record(.|\n)*"
        r"tool_errors\n  Input should be a valid list",
    ):
        TrajectoryRecord.of(s)
    s.metadata[VERSION_KEY] = 9
    with pytest.raises(ValueError, match="sample 7: metadata\\['trajectory_version'\\] is 9"):
        TrajectoryRecord.of(s)
    TrajectoryRecord.clear(s)
    assert s.metadata == {}


# ---- the real tool loop, end to end ----------------------------------------------------------
# The router + scripted engine harness of test_multi_turn (its `track` tool raises on mode "raise").


@pytest.mark.usefixtures("runtime_closed_on_the_test_loop")  # its HTTP session is on this test's loop
async def test_tool_loop_errors_reach_dashboard_dump_and_viewer(stack, tok, tmp_path):
    """Turn 1: a malformed call, a call to a tool that raises, a good calculator call; turn 2: the answer."""
    outs = [
        say(tok, MALFORMED + call("track", {"mode": "raise"}) + call("calculator", {"expression": "3 + 4"})),
        say(tok, "The answer is 7."),
    ]
    CASES["trajectory"] = lambda t, b: outs[t]
    args = make_args(stack, tok, rollout_data_dir=str(tmp_path))
    sample = sample_for("trajectory", {"track": {}, "calculator": {}}, index=3)
    sample.group_index = 0
    s = await generate(args, sample, dict(PARAMS))

    assert s.status == Sample.Status.COMPLETED, s.metadata
    crash = "tool 'track' failed: ValueError: boom"
    # what the loop wrote, read back through the record type
    rec = TrajectoryRecord.of(s)
    assert rec.turns == 2 and rec.finish_reason == "no_tool_call"
    assert rec.tool_errors == [ToolErrorRecord(turn=1, tool="track", kind="exception", message=crash)]
    assert [(e.turn, e.kind) for e in rec.parse_errors] == [(1, "malformed_json")]
    assert rec.parse_errors[0].raw.startswith('{"name": "calculator"')
    assert [(m.turn, m.name, m.arguments, m.response, m.error, m.executed) for m in rec.tool_messages] == [
        (
            1,
            None,
            None,
            f"Error: {rec.parse_errors[0].message}. Your output was: {rec.parse_errors[0].raw}",
            rec.parse_errors[0].message,
            False,
        ),
        (1, "track", {"mode": "raise"}, f"Error: {crash}", crash, True),
        (1, "calculator", {"expression": "3 + 4"}, "7", None, True),
    ]
    assert rec.tool_calls == {"track": 1, "calculator": 1}
    assert s.metadata["tool_calls"] == {"track": 1, "calculator": 1} and s.metadata["round_number"] == 2
    assert s.response.count("<tool_response>") == 3 and f"Error: {crash}" in s.response

    # the dashboard counts the records (a second, clean single-turn sample counts zero)
    clean = Sample(
        index=4,
        group_index=0,
        prompt="hi",
        tokens=[1, 2, 3],
        response="ok",
        response_length=1,
        loss_mask=[1],
        reward=0.0,
        status=Sample.Status.COMPLETED,
    )
    config = ReportConfig.from_args(args)
    m = compute_rollout_metrics(config, 0, [[s, clean]])
    assert (m["rollout/tool_errors"], m["rollout/parse_errors"]) == (1, 1)
    assert (m["rollout/tool_errors_per_sample"], m["rollout/parse_errors_per_sample"]) == (0.5, 0.5)
    assert m["rollout/tool_calls/track"] == 1 and m["rollout/tool_calls/calculator"] == 1
    assert m["rollout/turns_mean"] == 1.5 and m["rollout/tool_calls_per_sample"] == 1.0

    # the dump holds the records themselves
    path = dump_rollout(config, 0, [[s, clean]])
    lines = path.read_text().splitlines()
    line = json.loads(lines[0])["trajectory"]
    assert line["tool_errors"] == [{"turn": 1, "tool": "track", "kind": "exception", "message": crash}]
    assert [(e["turn"], e["kind"], e["raw"]) for e in line["parse_errors"]] == [
        (1, "malformed_json", rec.parse_errors[0].raw)
    ]
    assert [mm["name"] for mm in line["tool_messages"]] == [None, "track", "calculator"]
    assert line["tool_messages"][2]["response"] == "7" and line["tool_calls"] == {"track": 1, "calculator": 1}
    assert validate_line(lines[0]).trajectory == rec and json.loads(lines[1])["trajectory"] is None

    # the viewer reads them back through the same type
    [src] = V.discover(tmp_path)
    loaded = V.load(src)
    assert loaded.bad_lines == 0 and [V.error_count(r) for r in loaded.records] == [2, 0]
    assert [r["index"] for r in loaded.records if V.matches(r, V.parse_query("errors>0"))] == [3]
    assert [r["index"] for r in loaded.records if V.matches(r, V.parse_query("tool:track"))] == [3]
    text = V.render_sample(loaded.records[0]).plain
    assert "tool errors 1  parse errors 1" in text and "── errors (2) ──" in text
    assert f"turn 1 · exception · track: {crash}" in text
    assert re.search(r"\[2\] turn 1 · track\(\{\"mode\": \"raise\"\}\)\n    error: tool 'track' failed", text)
