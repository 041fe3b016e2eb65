"""slime's own rollout files at THUDM/slime@624b824a, unchanged (`tests/upstream_slime/`), import and
run on this package: `sglang_rollout.py` (through `slime.observability.trace_utils`,
`slime.backends.sglang_utils.server_control`, `slime.utils.data.Dataset`) behind the real router in
front of a scripted engine, `sglang_streaming_rollout.py` on top of it, and `data_source.py` (with
`DataSource.get_metadata`). Each file is loaded from its text under slime's module name, and put back
afterwards."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from slime.cli.args import parse_args
from slime.rollout.data_source import DataSource
from slime.testing.replying_stack import replying_stack
from slime.testing.runtime import bind_runtime
from slime.utils.async_utils import run
from slime.utils.types import Sample

UPSTREAM = Path(__file__).resolve().parent / "upstream_slime"
ANSWER = "The answer is \\boxed{4}"


def load_upstream(monkeypatch, rel: str, name: str):
    """slime's file `rel`, executed as module `name` (its relative imports resolve in our package)."""
    spec = importlib.util.spec_from_file_location(name, UPSTREAM / rel)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def stack(tiny_model_dir):
    with replying_stack(str(tiny_model_dir), lambda prompt: ANSWER) as s:
        yield s


def rollout_args(tmp_path, stack, model, *flags):
    router, _, _, _ = stack
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i}+{4 - i}?", "label": "4"}) + "\n" for i in range(2)))
    return parse_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(model),
            "--prompt-data",
            str(data),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--rm-type",
            "math",
            "--sglang-router-ip",
            router.host,
            "--sglang-router-port",
            str(router.port),
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--rollout-max-response-len",
            "32",
            *flags,
        ]
    )


def test_slimes_sglang_rollout_runs_unchanged_with_spans_on_each_sample(tmp_path, stack, tiny_model_dir, monkeypatch):
    upstream = load_upstream(monkeypatch, "slime/rollout/sglang_rollout.py", "slime.rollout.sglang_rollout")
    args = rollout_args(tmp_path, stack, tiny_model_dir)
    tok = stack[3]
    runtime = bind_runtime(args, tokenizer=tok)
    try:
        out = upstream.generate_rollout(args, 0, DataSource.from_args(args, tok))
    finally:
        upstream.GenerateState._instances.pop(upstream.GenerateState, None)  # slime's singleton, this test's
        run(runtime.client.close())
    groups = out.samples
    assert [len(g) for g in groups] == [2, 2]
    want = tok(ANSWER, add_special_tokens=False)["input_ids"]
    for s in (s for g in groups for s in g):
        assert s.tokens[-len(want) :] == want and s.response_length == len(want) and s.reward == 1
        spans = [e for e in s.trace["events"] if e["name"] == "sglang_generate"]
        assert [e["type"] for e in spans] == ["span_start", "span_end"]
        assert spans[1]["attrs"]["completion_tokens"] == len(want)
        assert spans[0]["span_id"] == spans[1]["span_id"] and spans[0]["sample_id"] == s.index
        assert Sample.from_dict(s.to_dict()).trace == s.trace  # what the rollout dump keeps


def test_slimes_streaming_rollout_imports_unchanged_on_slimes_rollout(monkeypatch):
    """It imports `GenerateState` and `_prepare_prompt_ids` from slime's own sglang_rollout (loaded
    from slime's file here); it runs on ours in `test_upstream_slime_on_engine.py`."""
    load_upstream(monkeypatch, "slime/rollout/sglang_rollout.py", "slime.rollout.sglang_rollout")
    streaming = load_upstream(
        monkeypatch, "slime/rollout/sglang_streaming_rollout.py", "slime.rollout.sglang_streaming_rollout"
    )
    assert callable(streaming.generate_streaming)


def test_slimes_data_source_runs_unchanged(tmp_path, tiny_model_dir, monkeypatch):
    """slime's RolloutDataSourceWithBuffer on `slime.utils.data.Dataset`: prompts as Samples, groups of
    n, the buffer served first, its metadata saved and loaded with its state."""
    upstream = load_upstream(monkeypatch, "slime/rollout/data_source.py", "slime.rollout._slime_data_source")
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"q{i}", "label": str(i), "metadata": {"row": i}}) + "\n" for i in range(5))
    )
    args = parse_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(data),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "3",
            "--rollout-shuffle",
            "--save",
            str(tmp_path / "save"),
        ]
    )
    source = upstream.RolloutDataSourceWithBuffer(args)
    assert len(source.dataset) == 5
    groups = source.get_samples(2)
    assert [len(g) for g in groups] == [3, 3] and all(s.label == str(s.metadata["row"]) for g in groups for s in g)
    assert {s.prompt for s in groups[0]} == {groups[0][0].prompt}
    source.add_samples([groups[1]])
    assert source.get_samples(1)[0] == groups[1]  # the buffer first
    source.update_metadata({"seen": 7})
    source.save(0)
    args.load = args.save  # as a resumed run gets it
    again = upstream.RolloutDataSourceWithBuffer(args)
    again.load(0)
    assert again.get_metadata() == {"seen": 7} and again.sample_offset == source.sample_offset


def test_our_data_source_keeps_metadata_as_slimes_does(tmp_path, tiny_model_dir):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "q", "label": "1"}) + "\n")
    args = parse_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(data),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--rollout-batch-size",
            "1",
        ]
    )
    source = DataSource.from_args(args)
    assert source.get_metadata() == {}
    source.update_metadata({"curriculum": 2})
    state = source.state_dict()
    fresh = DataSource.from_args(args)
    fresh.load_state_dict(state)
    assert fresh.get_metadata() == {"curriculum": 2}
