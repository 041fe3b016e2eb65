"""The fault injection's smaller findings, each refused clearly: a FIFO as --prompt-data, a prompt file
rewritten after it was indexed, a parquet map<string,string> column read by a dotted key, a row naming
an interaction the YAML lacks (found at preflight, not when served)."""

from __future__ import annotations

import json
import os

import pytest

from slime.cli.args import ArgError, parse_args
from slime.cli.preflight import PreflightError, preflight
from slime.rollout.data_source import DataError
from slime.rollout.prompt_index import PromptIndex


def test_a_fifo_as_prompt_data_is_named_as_such(tmp_path):
    fifo = tmp_path / "prompts.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(ArgError) as e:
        parse_args(["--prompt-data", str(fifo)])
    assert str(e.value) == (
        f"--prompt-data: a FIFO (named pipe), not a regular file (prompts are indexed by byte "
        f"offset and read again; write them to a file first): {fifo}"
    )


def test_a_prompt_file_rewritten_after_indexing_says_the_file_changed(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"input": f"question {i}"}) + "\n" for i in range(4)))
    args = parse_args(["--prompt-data", str(path)])
    index = PromptIndex.from_args(args, str(path), "input", None)
    try:
        assert index.row(1) == {"input": "question 1"}
        path.write_text(
            json.dumps({"input": "a much longer first question than before"})
            + "\n"
            + "".join(json.dumps({"input": f"question {i}"}) + "\n" for i in range(1, 4))
        )
        with pytest.raises(DataError) as e:
            index.row(2)  # its old offset now falls inside another line
        assert f"{path}:3: the file changed after it was indexed" in str(e.value), str(e.value)
        assert "invalid JSON" not in str(e.value)
    finally:
        index.close()


def test_a_parquet_map_column_is_read_by_its_dotted_key(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(
        pa.table(
            {
                "extra_info": pa.array(
                    [[("question", "what is 2+2?"), ("split", "train")]], type=pa.map_(pa.string(), pa.string())
                )
            }
        ),
        path,
    )
    args = parse_args(["--prompt-data", str(path), "--input-key", "extra_info.question"])
    index = PromptIndex.from_args(args, str(path), "extra_info.question", None)
    assert index.sample(0, tokenize=False).prompt == "what is 2+2?"


def test_a_row_naming_an_interaction_the_yaml_lacks_is_refused_at_preflight(tmp_path):
    config = tmp_path / "interactions.yaml"
    config.write_text(
        "interaction:\n  - name: gsm8k\n    class_name: "
        "verl.interactions.gsm8k_interaction.Gsm8kInteraction\n    config: {}\n"
    )
    data = tmp_path / "p.jsonl"
    rows = [
        {
            "prompt": [{"role": "user", "content": f"q{i}"}],
            "extra_info": {"interaction_kwargs": {"name": name, "ground_truth": "4"}},
        }
        for i, name in enumerate(["gsm8k", "gsm8k", "weather"])
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = parse_args(
        [
            "--prompt-data",
            str(data),
            "--input-key",
            "prompt",
            "--interaction-config-path",
            str(config),
            "--rollout-function-path",
            "rollout_plugins.multi_turn.generate_rollout",
        ]
    )
    with pytest.raises(PreflightError) as e:
        preflight(args)
    assert str(e.value) == (
        f"--prompt-data: {data}:3: interaction_kwargs names interaction 'weather', which "
        f"{config} does not configure (it has ['gsm8k'])"
    )


def test_a_line_longer_than_the_bound_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    import slime.rollout.prompt_index as prompt_index

    monkeypatch.setattr(prompt_index, "MAX_LINE_BYTES", 1024)  # (256 MiB in a run; a 2.2 GB line took 4.5 GB)
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"input": "short"}) + "\n" + json.dumps({"input": "x" * 5000}) + "\n")
    args = parse_args(["--prompt-data", str(path)])
    with pytest.raises(PreflightError) as e:
        preflight(args)
    assert str(e.value) == (
        f"--prompt-data: {path}:2: the line is longer than 1024 bytes; a prompt row is one JSON "
        "object per line (is this JSONL, or a whole dataset on one line?)"
    )
    with pytest.raises(DataError, match=r":2: the line is longer than 1024 bytes"):
        PromptIndex.from_args(args, str(path), "input", None)
