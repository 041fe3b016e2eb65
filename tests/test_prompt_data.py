"""Prompt data that fails early and streams (issue 20, items 12 and 14).

Preflight renders and tokenises every row as the manager will, so a bad row is named by flag, file
and line before anything starts; the data source reads rows from the file when it serves them
(`PromptIndex`) and serves exactly what the whole-file list served.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.cli.args import parse_args
from slime.cli.command import run_cli
from slime.rollout.data_source import DataSource
from slime.rollout.prompt_index import IndexProgress, PromptIndex, count_rows
from slime.utils.plugin_args import completed


def _args(**kw):
    base = dict(
        apply_chat_template=False,
        apply_chat_template_kwargs={},
        rollout_max_prompt_len=None,
        rollout_max_context_len=None,
        metadata_key=None,
        tool_key=None,
        over_long_prompt="filter",
        rollout_seed=42,
        buffer_filter_path=None,
    )
    return completed(SimpleNamespace(**{**base, **kw}))  # the parser's defaults for the rest


def _preflight(capsys, model: Path, data: Path, *extra: str) -> tuple[int, list, str]:
    seen = []
    argv = ["--rollout-backend", "hf", "--hf-checkpoint", str(model), "--prompt-data", str(data), *extra]
    rc = run_cli("slime-rollout", argv, parse_args, seen.append)
    return rc, seen, capsys.readouterr().err


GOOD = '{"messages": [{"role": "user", "content": "Hi"}]}\n'


@pytest.mark.parametrize(
    "row,expected",
    [
        ('{"messages": []}', "key 'messages' is an empty message list (--apply-chat-template has nothing to render)"),
        (
            '{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
            "messages[0]['content'] holds a lone surrogate ('\\ud800' at character 1), not text; fix the row",
        ),
        (
            '{"messages": [{"role": "user", "content": 7}]}',
            "messages[0]['content'] must be a string (or a list of content parts), got int 7",
        ),
        ('{"messages": [{"role": 1, "content": "x"}]}', "messages[0]['role'] must be a string, got int"),
    ],
)
def test_a_bad_chat_row_is_named_before_anything_starts(tmp_path, tiny_model_dir, capsys, row, expected):
    data = tmp_path / "d.jsonl"
    data.write_text(GOOD + "\n" + row + "\n" + GOOD)
    rc, seen, err = _preflight(capsys, tiny_model_dir, data, "--input-key", "messages", "--apply-chat-template")
    assert rc == 1 and seen == []
    assert err == f"slime-rollout: error: --prompt-data: {data}:3: {expected}\n"


def test_a_lone_surrogate_in_a_plain_prompt_is_named(tmp_path, tiny_model_dir, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "ok"}\n{"input": "\\udc80"}\n')
    rc, seen, err = _preflight(capsys, tiny_model_dir, data)
    assert rc == 1 and seen == []
    assert err == (
        f"slime-rollout: error: --prompt-data: {data}:2: key 'input' holds a lone surrogate ('\\udc80' "
        "at character 0), not text; fix the row\n"
    )


def test_an_over_long_prompt_is_counted_by_the_template_preflight_renders(tmp_path, tiny_model_dir, capsys):
    """--over-long-prompt error with --apply-chat-template: the rendered prompt's tokens decide."""
    data = tmp_path / "d.jsonl"
    data.write_text(GOOD + json.dumps({"messages": [{"role": "user", "content": "word " * 40}]}) + "\n")
    rc, seen, err = _preflight(
        capsys,
        tiny_model_dir,
        data,
        "--input-key",
        "messages",
        "--apply-chat-template",
        "--rollout-max-prompt-len",
        "30",
        "--over-long-prompt",
        "error",
    )
    assert rc == 1 and seen == []
    assert err.startswith(f"slime-rollout: error: --prompt-data: {data}:2: prompt has ")
    assert err.endswith("tokens, over the limit 30 (--rollout-max-prompt-len); use --over-long-prompt filter\n")


lines = st.lists(
    st.one_of(
        st.fixed_dictionaries({"input": st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)}),
        st.sampled_from(["", "   ", "\t"]),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(lines=lines, start=st.integers(-5, 5), stop=st.one_of(st.none(), st.integers(-5, 30)))
def test_the_index_serves_every_non_blank_line_with_its_line_number(tmp_path_factory, lines, start, stop):
    data = tmp_path_factory.mktemp("idx") / "d.jsonl"
    data.write_text(
        "".join((json.dumps(x, ensure_ascii=False) if isinstance(x, dict) else x) + "\n" for x in lines),
        encoding="utf-8",
    )
    rows = [(n, x["input"]) for n, x in enumerate(lines, 1) if isinstance(x, dict)][start:stop]
    spec = f"{data}@[{start}:{'' if stop is None else stop}]"
    if not rows:
        with pytest.raises(ValueError):
            PromptIndex.from_args(_args(), spec, "input", None)
        return
    index = PromptIndex.from_args(_args(), spec, "input", None)
    assert [s.prompt for s in index] == [text for _, text in rows]
    assert [index.where(i) for i in range(len(index))] == [f"{data}:{n}" for n, _ in rows]
    assert count_rows(spec) == len(rows)


def test_the_data_source_serves_the_same_groups_from_the_index_as_from_a_list(tmp_path, tiny_model_dir):
    from slime.utils.processing_utils import load_tokenizer

    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"q{i}"}], "label": str(i)}) + "\n" for i in range(7)
        )
    )
    args = _args(
        apply_chat_template=True,
        prompt_data=str(data),
        input_key="messages",
        label_key="label",
        n_samples_per_prompt=2,
        rollout_shuffle=True,
    )
    tok = load_tokenizer(tiny_model_dir)
    streamed = DataSource.from_args(args, tok)
    assert isinstance(streamed.prompts, PromptIndex)
    listed = DataSource(args, list(streamed.prompts), 2, shuffle=True)

    def served(source, n):
        return [(s.index, s.group_index, s.label, s.prompt, s.tokens) for g in source.get_samples(n) for s in g]

    assert served(streamed, 10) == served(listed, 10)  # across the epoch boundary (7 prompts)
    state = streamed.state_dict()
    resumed = DataSource.from_args(args, tok)
    resumed.load_state_dict(state)
    assert served(resumed, 5) == served(listed, 5)
    first = streamed.prompts[0]
    assert first.tokens == tok(first.prompt, add_special_tokens=False)["input_ids"]
    assert streamed.prompts[0] is not first  # rows are read when served, not held


def test_indexing_prints_a_progress_line_while_it_runs(tmp_path, capsys):
    progress = IndexProgress(tmp_path / "big.jsonl", "indexed", 300 << 20)
    progress.start = progress.last = time.monotonic() - 6  # six seconds into a long read
    progress.tick(120 << 20, 1000)
    progress.tick(121 << 20, 1010)  # not again within PROGRESS_EVERY_S
    out = capsys.readouterr().out
    assert out == f"prompt data {tmp_path / 'big.jsonl'}: indexed 120 of 300 MB (1000 rows, 6 s)\n"


def test_sigterm_while_preflight_checks_a_large_file_stops_the_command(tmp_path, tiny_model_dir, cli_runs):
    """Checking every row of a large file takes a while (progress lines); SIGTERM is honoured at once.
    The command prints a progress line every PROGRESS_ROWS rows here (interval 0 s, set in its own process),
    so the signal comes after the first of ten chunks whatever the box's speed (at 5 s a line, a box that
    checks the file in under 5 s would print none)."""
    data = tmp_path / "big.jsonl"
    row = {"messages": [{"role": "user", "content": "lorem ipsum " * 60}]}
    data.write_text((json.dumps(row) + "\n") * 40000)
    every_chunk = "import runpy, slime.rollout.prompt_index as p; p.PROGRESS_EVERY_S = 0.0; "
    every_chunk += "runpy.run_module('slime', run_name='__main__', alter_sys=True)"
    proc = cli_runs.start(
        [
            "-c",
            every_chunk,
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(data),
            "--input-key",
            "messages",
            "--apply-chat-template",
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        deadline=300,
    )
    lines: list[str] = []
    cli_runs.read_until(proc, f"prompt data {data}: checked", lines)
    out = cli_runs.stop(proc, signal.SIGTERM, 30)
    assert proc.returncode == 143, "".join(lines) + out
    # honoured in the middle of the check, not after it: the check's closing line (`..., done`) never came
    # (no bound on the clock: a loaded box may take any time to deliver and exit, the stop waits at most 30 s)
    checked = [line for line in ("".join(lines) + out).splitlines() if f"{data}: checked" in line]
    assert checked and not any(line.endswith(", done") for line in checked), "".join(lines) + out
    assert "slime-rollout: terminated; everything started was stopped" in out


def test_the_length_filter_runs_once_preflight_hands_its_rows_to_the_manager(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    """Issue 20: with --apply-chat-template and a prompt limit, preflight tokenises every row; the
    manager's index of the same file drops the same rows without tokenising them again, and a file
    changed since preflight is filtered anew."""
    from slime.utils.processing_utils import load_tokenizer

    data = tmp_path / "d.jsonl"
    rows = [("long " * 40 if i % 3 == 1 else f"q{i}") for i in range(9)]
    data.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": r}], "label": str(i)}) + "\n"
            for i, r in enumerate(rows)
        )
    )
    rc, seen, err = _preflight(
        capsys,
        tiny_model_dir,
        data,
        "--input-key",
        "messages",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rollout-max-prompt-len",
        "30",
    )
    assert (rc, err) == (0, "") and len(seen) == 1
    args = seen[0]
    tokenised = []
    real = PromptIndex._token_counts
    monkeypatch.setattr(PromptIndex, "_token_counts", lambda self, what: tokenised.append(what) or real(self, what))
    tok = load_tokenizer(tiny_model_dir)
    source = DataSource.from_args(args, tok)
    assert tokenised == [] and source.filtered_prompts == 3
    assert [s.label for s in source.prompts] == ["0", "2", "3", "5", "6", "8"]
    assert "filtered 3 prompt(s) longer than 30 tokens" in capsys.readouterr().out

    data.write_text(
        data.read_text() + json.dumps({"messages": [{"role": "user", "content": "long " * 40}], "label": "9"}) + "\n"
    )
    again = DataSource.from_args(args, tok)  # the file changed: its rows are tokenised and filtered here
    assert tokenised == ["tokenised"] and again.filtered_prompts == 4
    assert [s.label for s in again.prompts] == ["0", "2", "3", "5", "6", "8"]
