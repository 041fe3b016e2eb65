"""RolloutViewer driven headless with textual's Pilot over real dumps (JSONL and .pt)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from slime.observability import viewer_data as V
from slime.observability.flags import ReportConfig
from slime.observability.rollout_dump import dump_eval, dump_rollout
from slime.observability.viewer import RolloutViewer
from slime.utils.trajectory import ToolMessage, TrajectoryRecord, TurnSpan
from slime.testing.tiny_model import qwen_tokenizer_dir
from slime.utils.types import Sample

A1 = 'Let me compute.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(6*7)"}}\n</tool_call><|im_end|>\n'
T1 = "<|im_start|>user\n<tool_response>\nFORTY-TWO-FROM-TOOL\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
A2 = "The answer is 42.<|im_end|>"


def multi_turn_sample(tok) -> Sample:
    prompt = [{"role": "user", "content": "What is 6*7? Use python."}]
    p_ids = tok.encode("<|im_start|>user\nWhat is 6*7? Use python.<|im_end|>\n<|im_start|>assistant\n").ids
    parts = [tok.encode(x).ids for x in (A1, T1, A2)]
    spans, mask, pos = [], [], 0
    for turn, role, ids in zip((1, 1, 2), ("assistant", "tool", "assistant"), parts):
        spans.append(TurnSpan(turn=turn, role=role, start=pos, end=pos + len(ids)))
        mask += [1 if role == "assistant" else 0] * len(ids)
        pos += len(ids)
    s = Sample(
        group_index=9,
        index=99,
        prompt=prompt,
        tokens=p_ids + sum(parts, []),
        response=A1 + T1 + A2,
        response_length=pos,
        label="42",
        reward={"score": 1.0, "format": 1.0},
        loss_mask=mask,
        status=Sample.Status.COMPLETED,
    )
    TrajectoryRecord(
        turns=2,
        finish_reason="no_tool_call",
        turn_spans=spans,
        tool_messages=[
            ToolMessage(
                turn=1, name="python", arguments={"code": "print(6*7)"}, response="FORTY-TWO-FROM-TOOL", executed=True
            )
        ],
    ).store(s)
    return s


def simple(i: int, reward: float, status=Sample.Status.COMPLETED, text: str = "") -> Sample:
    return Sample(
        group_index=i // 2,
        index=i,
        prompt=f"question {i}",
        tokens=[1, 2, 3, 4, 5],
        response=text or f"answer number {i}",
        response_length=2,
        label=str(i),
        reward=reward,
        loss_mask=[1, 1],
        status=status,
        metadata={"data_source": "gsm8k" if i % 2 else "math"},
    )


@pytest.fixture
def dump_dir(tmp_path) -> Path:
    from tokenizers import Tokenizer

    from slime.cli.finalize import complete_namespace

    tok_dir = qwen_tokenizer_dir()
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    args = ReportConfig.from_args(
        complete_namespace(argparse.Namespace(rollout_data_dir=str(tmp_path), hf_checkpoint=str(tok_dir)))
    )
    dump_rollout(
        args,
        0,
        [
            [simple(0, 0.0), simple(1, 1.0, Sample.Status.TRUNCATED)],
            [simple(2, 0.5, text="a needle in the haystack"), simple(3, 0.0)],
        ],
    )
    dump_rollout(args, 1, [multi_turn_sample(tok), simple(4, 0.25)])
    dump_eval(args, 0, {"gsm8k": {"rewards": [1.0], "truncated": [False], "samples": [simple(5, 1.0)]}})
    # a dump cut off mid-line (writer killed) and an empty one
    good = (tmp_path / "0.jsonl").read_text().splitlines()[0]
    (tmp_path / "2.jsonl").write_text(good + "\n" + good[: len(good) // 2])
    (tmp_path / "4.jsonl").write_text("")
    import torch

    torch.save(
        {"rollout_id": 3, "samples": [simple(6, 0.75).to_dict(), multi_turn_sample(tok).to_dict()]},
        tmp_path / "rollout_3.pt",
    )
    return tmp_path


def indices(app: RolloutViewer) -> list:
    return [r["index"] for r in app.rows]


async def type_query(pilot, text: str) -> None:
    await pilot.press("slash")
    inp = pilot.app.query_one("#query")
    inp.value = ""
    await pilot.press(*text)
    await pilot.press("enter")
    await pilot.pause()


async def test_viewer_navigate_search_filter_sort(dump_dir):
    app = RolloutViewer(dump_dir)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        assert [s.label for s in app.sources] == ["step 0", "step 1", "step 2", "step 4", "eval gsm8k @ 0", "debug 3"]
        assert indices(app) == [0, 1, 2, 3] and "step 0" in app.detail_plain and "question 0" in app.detail_plain
        await pilot.press("j")
        await pilot.pause()
        assert app.current_record["index"] == 1 and "status truncated" in app.detail_plain

        await type_query(pilot, "needle")
        assert indices(app) == [2]
        await type_query(pilot, "status:truncated")
        assert indices(app) == [1]
        await type_query(pilot, "score>0")
        assert indices(app) == [1, 2]
        await type_query(pilot, "dataset:gsm8k")
        assert indices(app) == [1, 3]
        await type_query(pilot, "")
        await pilot.press("s")  # sort: score descending
        await pilot.pause()
        assert app.sort_mode == "score ↓" and indices(app) == [1, 2, 0, 3]
        await pilot.press("s", "s", "s", "s")
        assert app.sort_mode == "index"

        await pilot.press("right_square_bracket")
        await pilot.pause()
        assert app.step_index == 1 and indices(app) == [99, 4]
        text = app.detail_plain  # the multi-turn sample, decoded with the tokenizer recorded in the dump
        assert "turn 1: assistant" in text and "· trained" in text
        tool_turn = [line for line in text.splitlines() if line.startswith("── turn 2: tool")]
        assert tool_turn and tool_turn[0].endswith("· masked ──")
        assert text.index("turn 2: tool") < text.index("FORTY-TWO-FROM-TOOL") < text.index("turn 3: assistant")
        assert "The answer is 42." in text and "── tool calls ──" in text
        assert 'python({"code": "print(6*7)"})' in text
        await type_query(pilot, "tool:python")
        assert indices(app) == [99]

        await pilot.press("right_square_bracket")  # the truncated file: one good line, the torn one skipped
        await pilot.pause()
        assert app.step_index == 2 and len(app.loaded.records) == 1 and app.rows == []  # tool:python still on
        await type_query(pilot, "")
        assert indices(app) == [0] and "1 unreadable line(s) skipped" in app.status_plain
        await pilot.press("right_square_bracket")
        await pilot.pause()
        assert app.rows == [] and "empty file" in app.status_plain and app.detail_plain == "(no sample)"
        await pilot.press("right_square_bracket")
        await pilot.pause()
        assert indices(app) == [5] and app.current_record["evaluation"] and app.current_record["dataset"] == "gsm8k"
        await pilot.press("right_square_bracket", "right_square_bracket")  # past the end stays on the last
        await pilot.pause()
        assert app.step_index == 5 and indices(app) == [6, 99] and app.current_record["step"] == 3
        await pilot.press("left_square_bracket")
        await pilot.pause()
        assert app.step_index == 4


async def test_viewer_without_tokenizer_shows_spans_and_text(tmp_path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(qwen_tokenizer_dir() / "tokenizer.json"))
    from slime.cli.finalize import complete_namespace

    config = ReportConfig.from_args(complete_namespace(argparse.Namespace(rollout_data_dir=str(tmp_path))))
    dump_rollout(config, 0, [multi_turn_sample(tok)])
    app = RolloutViewer(tmp_path)
    async with app.run_test() as pilot:
        await pilot.pause()
        text = app.detail_plain
        assert "turn 2: tool" in text and "masked" in text and "pass --tokenizer" in text
        assert "FORTY-TWO-FROM-TOOL" in text  # from the response text and the tool messages


async def test_viewer_empty_and_missing_dirs(tmp_path):
    for root in (tmp_path, tmp_path / "missing"):
        app = RolloutViewer(root)
        async with app.run_test() as pilot:
            await pilot.pause()
            await pilot.press("right_square_bracket", "j", "s")
            assert app.sources == [] and app.rows == [] and "no rollout dumps" in app.status_plain


def test_discover_several_roots(dump_dir, tmp_path_factory):
    other = tmp_path_factory.mktemp("debug")
    (other / "rollout_12.pt").write_bytes(b"not a torch file")
    srcs = V.discover([dump_dir, other, other / "rollout_12.pt"])
    assert [s.label for s in srcs][-2:] == ["debug 3", "debug 12"]
    loaded = V.load(srcs[-1])
    assert loaded.records == [] and loaded.error


def test_query_parsing():
    q = V.parse_query('status:truncated,failed dataset:gsm8k score>=0.5 len<10 "two words" x')
    assert q.status == {"truncated", "failed"} and q.dataset == {"gsm8k"}
    assert q.numeric == [("score", ">=", 0.5), ("len", "<", 10.0)] and q.text == ["two words", "x"]
    assert V.parse_query('unbalanced "quote').text == ["unbalanced", '"quote']
