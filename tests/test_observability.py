"""Metrics, metrics.jsonl, report PNGs, rollout dumps and progress (no wandb here; see
test_observability_wandb.py)."""

from __future__ import annotations

import argparse
import io
import json
import logging
import math
import runpy
import sys
from pathlib import Path

import pytest

from slime.cli.finalize import complete_namespace
from slime.observability import metrics as M
from slime.observability import reporting, rollout_dump
from slime.observability.flags import ReportConfig, add_observability_arguments
from slime.observability.metrics_log import read_metrics
from slime.observability.progress import RolloutProgress
from slime.utils.trajectory import ParseErrorRecord, ToolErrorRecord, ToolMessage, TrajectoryRecord, TurnSpan
from slime.utils.types import Sample


def _ns(**kw) -> argparse.Namespace:
    """A namespace built by hand, completed with the flags' defaults where the command line's would be."""
    return complete_namespace(argparse.Namespace(**kw))


def _cfg(**kw) -> ReportConfig:
    """What the metrics, logs and dumps receive: the config of such a namespace."""
    return ReportConfig.from_args(_ns(**kw))


ROOT = Path(__file__).resolve().parents[1]


def make_sample(
    g: int,
    i: int,
    reward,
    length: int = 4,
    status=Sample.Status.COMPLETED,
    trajectory: TrajectoryRecord | None = None,
    mask: list[int] | None = None,
    **meta,
) -> Sample:
    prompt = [1, 2, 3]
    s = Sample(
        group_index=g,
        index=i,
        prompt=f"question {g}",
        tokens=prompt + list(range(10, 10 + length)),
        response=f"answer {g}.{i}",
        response_length=length,
        label=str(g),
        reward=reward,
        loss_mask=mask or [1] * length,
        status=status,
        metadata=meta,
    )
    if trajectory is not None:
        trajectory.store(s)
    return s


def call(turn: int, name: str, **kw) -> ToolMessage:
    return ToolMessage(turn=turn, name=name, executed=True, **kw)


def tool_trajectory() -> TrajectoryRecord:
    """3 turns, 3 executed calls (python x2, search), one of which raised."""
    return TrajectoryRecord(
        turns=3,
        finish_reason="no_tool_call",
        non_generation_time=1.5,
        turn_spans=[
            TurnSpan(turn=1, role="assistant", start=0, end=2),
            TurnSpan(turn=1, role="tool", start=2, end=4),
            TurnSpan(turn=2, role="assistant", start=4, end=6),
        ],
        tool_messages=[
            call(1, "python", arguments={"code": "1+1"}, response="2"),
            call(2, "python", arguments={"code": "1/0"}, response="Error: boom", error="boom"),
            call(2, "search", arguments={"q": "x"}, response="found"),
        ],
        tool_errors=[ToolErrorRecord(turn=2, tool="python", kind="exception", message="boom")],
    )


def parse_error_trajectory() -> TrajectoryRecord:
    bad = [
        ParseErrorRecord(turn=1, kind="malformed_json", message="not JSON", raw="<tool_call>{"),
        ParseErrorRecord(turn=1, kind="unclosed", message="no </tool_call>", raw="<tool_call>"),
    ]
    return TrajectoryRecord(
        turns=1,
        finish_reason="no_tool_call",
        parse_errors=bad,
        tool_messages=[ToolMessage(turn=1, error=e.message) for e in bad],
    )


def groups() -> list[list[Sample]]:
    """3 groups of 2: one mixed, one all-zero (zero variance), one dict-reward multi-turn group."""
    return [
        [make_sample(0, 0, 1.0, 4), make_sample(0, 1, 0.0, 8, Sample.Status.TRUNCATED)],
        [make_sample(1, 2, 0.0, 2), make_sample(1, 3, 0.0, 2)],
        [
            make_sample(2, 4, {"score": 1.0, "format": 0.5}, 6, trajectory=tool_trajectory(), mask=[1, 1, 0, 0, 1, 1]),
            make_sample(2, 5, {"score": 0.0, "format": 1.0}, 4, trajectory=parse_error_trajectory()),
        ],
    ]


def parse(argv: list[str]) -> argparse.Namespace:
    return add_observability_arguments(argparse.ArgumentParser()).parse_args(argv)


def test_flags_and_defaults():
    a = parse([])
    assert a.use_wandb is False and a.wandb_mode == "offline" and a.rollout_data_dir is None
    a = parse(
        [
            "--use-wandb",
            "--wandb-project",
            "p",
            "--wandb-group",
            "g",
            "--wandb-dir",
            "x",
            "--wandb-always-use-train-step",
            "--log-passrate",
            "--rollout-data-dir",
            "d",
            "--metrics-dir",
            "m",
            "--wandb-run-name",
            "n",
            "--wandb-mode",
            "online",
        ]
    )
    assert (a.wandb_project, a.wandb_group, a.wandb_dir, a.metrics_dir, a.wandb_mode) == ("p", "g", "x", "m", "online")
    assert a.wandb_always_use_train_step and a.log_passrate


def test_rollout_metrics():
    m = M.compute_rollout_metrics(
        _cfg(), 3, groups(), {"rollout_time": 2.0, "engine": {"requests": 7, "retries": 2, "failures": 0}}
    )
    assert m["rollout/num_samples"] == 6 and m["rollout/num_groups"] == 3
    assert m["rollout/reward_mean"] == pytest.approx(2 / 6)
    assert m["rollout/reward_std"] == pytest.approx(math.sqrt(2 / 6 * 4 / 6))
    assert m["rollout/response_len_max"] == 8 and m["rollout/response_len_mean"] == pytest.approx(26 / 6)
    assert m["rollout/truncated_ratio"] == pytest.approx(1 / 6)
    assert m["rollout/zero_std_groups"] == 1 and m["rollout/zero_std_group_ratio"] == pytest.approx(1 / 3)
    assert m["rollout/turns_mean"] == pytest.approx((3 + 5) / 6) and m["rollout/turns_max"] == 3
    assert m["rollout/tool_calls_per_sample"] == pytest.approx(3 / 6)
    assert m["rollout/tool_calls/python"] == 2 and m["rollout/tool_calls/search"] == 1
    assert m["rollout/tool_errors"] == 1 and m["rollout/parse_errors"] == 2
    assert m["rollout/reward/format"] == pytest.approx(0.75)
    assert m["rollout/trained_token_ratio"] == pytest.approx(24 / 26)
    assert m["perf/rollout_time"] == 2.0 and m["perf/tokens_per_s"] == pytest.approx(13.0)
    assert m["perf/engine_retries"] == 2 and m["perf/engine_requests"] == 7
    assert m["perf/longest_sample_tokens"] == 8 and m["perf/tool_time_total"] == 1.5
    # a flat list grouped by group_index gives the same numbers
    flat = [s for g in groups() for s in g]
    assert M.compute_rollout_metrics(_cfg(), 3, flat, {}) == pytest.approx(
        M.compute_rollout_metrics(_cfg(), 3, groups(), {})
    )
    assert M.compute_rollout_metrics(None, 0, [], {})["rollout/num_samples"] == 0


def eval_data() -> dict:
    # 2 prompts x 4 samples: prompt 0 solves 1/4, prompt 1 solves 4/4
    rewards = [1, 0, 0, 0, 1, 1, 1, 1]
    samples = [
        make_sample(i // 4, i, float(r), 3 + i, Sample.Status.TRUNCATED if i == 7 else Sample.Status.COMPLETED)
        for i, r in enumerate(rewards)
    ]
    return {
        "gsm8k": {"rewards": [float(r) for r in rewards], "truncated": [i == 7 for i in range(8)], "samples": samples},
        "aime-24": {"rewards": [0.0, 1.0], "truncated": [False, False], "samples": samples[:2]},
    }


def test_eval_metrics_and_passrate():
    args = _cfg(n_samples_per_eval_prompt=4, log_passrate=True)
    m = M.compute_eval_metrics(args, 5, eval_data())
    assert m["eval/gsm8k"] == pytest.approx(5 / 8)
    assert m["eval/gsm8k-truncated_ratio"] == pytest.approx(1 / 8)
    assert m["eval/gsm8k-pass@1"] == pytest.approx((0.25 + 1) / 2)
    assert m["eval/gsm8k-pass@2"] == pytest.approx((0.5 + 1) / 2)  # 1 - C(3,2)/C(4,2) = 0.5
    assert m["eval/gsm8k-pass@4"] == pytest.approx(1.0)
    assert "eval/gsm8k-pass@8" not in m
    assert m["eval/gsm8k-response_len_max"] == 10 and m["eval/gsm8k-response_len_mean"] == pytest.approx(6.5)
    assert m["eval/aime-24"] == 0.5
    assert not any("pass@" in k for k in M.compute_eval_metrics(_cfg(), 5, eval_data()))


def test_train_step():
    sizes = {"rollout_batch_size": 8, "n_samples_per_prompt": 4, "global_batch_size": 16}
    assert M.log_step(_cfg(**sizes, wandb_always_use_train_step=True), 3) == 3 * 8 * 4 // 16
    assert M.log_step(_cfg(**sizes), 3) == 3


def test_dumps_validate_against_schema(tmp_path):
    args = _cfg(rollout_data_dir=str(tmp_path), hf_checkpoint="/models/x")
    assert rollout_dump.dump_rollout(_cfg(), 0, groups()) is None  # flag unset: no-op
    path = rollout_dump.dump_rollout(args, 7, groups())
    assert path == tmp_path / "7.jsonl"
    lines = path.read_text().splitlines()
    assert len(lines) == 6
    recs = [rollout_dump.validate_line(line) for line in lines]
    assert all(r.schema_version == rollout_dump.SCHEMA_VERSION and r.step == 7 for r in recs)
    first = json.loads(lines[0])
    for key in ("input", "output", "score", "step", "label", "status", "tokens", "loss_mask_spans"):
        assert key in first
    mt = recs[4]
    assert mt.score == 1.0 and mt.reward == {"score": 1.0, "format": 0.5}
    assert [(s.start, s.end, s.mask) for s in mt.loss_mask_spans] == [(0, 2, 1), (2, 4, 0), (4, 6, 1)]
    assert mt.trajectory == tool_trajectory()  # read back as the type the tool loop wrote
    assert mt.trajectory.tool_calls == {"python": 2, "search": 1} and mt.trajectory.non_generation_time == 1.5
    assert mt.metadata == {} and mt.tokenizer == "/models/x"  # every trajectory key went into `trajectory`
    line = json.loads(lines[4])["trajectory"]
    assert line["tool_errors"] == [{"turn": 2, "tool": "python", "kind": "exception", "message": "boom"}]
    assert line["tool_calls"] == {"python": 2, "search": 1} and line["round_number"] == 3
    assert recs[5].trajectory == parse_error_trajectory() and recs[0].trajectory is None
    assert recs[1].status == "truncated" and recs[1].prompt_length == 3
    # eval datasets get their own files
    paths = rollout_dump.dump_eval(args, 7, eval_data())
    assert sorted(p.relative_to(tmp_path).as_posix() for p in paths) == ["eval/aime-24/7.jsonl", "eval/gsm8k/7.jsonl"]
    assert all(rollout_dump.validate_line(x).evaluation for x in paths[0].read_text().splitlines())
    assert "properties" in rollout_dump.json_schema()
    with pytest.raises(ValueError):
        rollout_dump.validate_line('{"input": "x"}')


def test_metrics_jsonl_and_report(tmp_path):
    args = _cfg(
        metrics_dir=str(tmp_path),
        n_samples_per_eval_prompt=4,
        log_passrate=True,
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        global_batch_size=2,
        wandb_always_use_train_step=True,
    )
    for rid in range(3):
        out = reporting.log_rollout(args, rid, groups(), {"rollout_time": 1.0 + rid})
        assert out["rollout/step"] == out["perf/step"] == rid * 2
        if rid % 2 == 0:
            assert reporting.log_eval(args, rid, eval_data())["eval/step"] == rid * 2
    recs = list(read_metrics(tmp_path / "metrics.jsonl"))
    assert [r["kind"] for r in recs] == ["rollout", "perf", "eval", "rollout", "perf", "rollout", "perf", "eval"]
    assert all(all(k.startswith(r["kind"] + "/") for k in r["metrics"]) for r in recs)
    assert recs[-1]["metrics"]["eval/gsm8k-pass@4"] == 1.0 and recs[-1]["step"] == 4
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"kind": "rollout", "metr')  # a torn line is skipped
    assert len(list(read_metrics(tmp_path))) == 8

    out_dir = tmp_path / "report"
    old_argv = sys.argv
    sys.argv = ["report.py", str(tmp_path / "metrics.jsonl"), "-o", str(out_dir)]
    try:
        with pytest.raises(SystemExit) as e:
            runpy.run_path(str(ROOT / "tools" / "report.py"), run_name="__main__")
        assert e.value.code == 0
    finally:
        sys.argv = old_argv
    names = sorted(p.name for p in out_dir.glob("*.png"))
    assert names == ["eval_aime-24.png", "eval_gsm8k.png", "perf.png", "response_length.png", "reward.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in out_dir.glob("*.png"))


def test_metrics_dir_defaults_to_rollout_data_dir(tmp_path, monkeypatch):
    args = _cfg(rollout_data_dir=str(tmp_path / "dumps"))
    out = reporting.log_rollout(args, 0, groups(), {})
    recs = list(read_metrics(tmp_path / "dumps" / "metrics.jsonl"))
    assert [(r["kind"], r["step_key"], r["step"]) for r in recs] == [
        ("rollout", "rollout/step", 0),
        ("perf", "perf/step", 0),
    ]
    assert recs[0]["metrics"]["rollout/num_samples"] == 6 and recs[0]["metrics"]["rollout/tool_errors"] == 1
    assert {**recs[0]["metrics"], **recs[1]["metrics"]} == pytest.approx(out)
    # no --metrics-dir, --rollout-data-dir or wandb: the same metrics are returned, no file is written
    monkeypatch.chdir(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert reporting.log_rollout(_cfg(), 0, groups(), {}) == pytest.approx(out)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_progress_plain_log_lines(caplog):
    caplog.set_level(logging.INFO, logger="slime.rollout.progress")
    with RolloutProgress(10, "rollout 1", log_interval=0.0, force_terminal=False) as p:
        p.update(done=4, in_flight=3, tokens=100, retries=1)
    lines = [r.getMessage() for r in caplog.records]
    assert any("rollout 1: 4/10 samples, 3 in flight" in x and "1 retries" in x for x in lines)
    assert lines[-1].endswith("(done)")


def test_progress_rich_bar():
    buf = io.StringIO()
    with RolloutProgress(8, "rollout 2", force_terminal=True, file=buf) as p:
        p.update(done=8, in_flight=0, tokens=50, retries=3)
    out = buf.getvalue()
    assert "rollout 2" in out and "8/8" in out and "retries 3" in out
