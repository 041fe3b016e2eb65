"""What a sample seeds an agent's workspace with (files, a git checkout, grading files), checked
before any sandbox starts; the tarballs workspaces travel in; the agent rollout's one-line report."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.agent.flags import AgentConfig
from slime.agent.report import format_line, summarize
from slime.agent.rollout import AgentRun
from slime.agent.sandboxes.workspace import GitSource, WorkspaceError, WorkspaceSeed, git_tarball, pack, unpack
from slime.utils.plugin_args import completed
from slime.utils.types import Sample

WHO = "sample index=7"


def test_a_seed_reads_files_git_grading_files_and_command_from_the_metadata():
    seed = WorkspaceSeed.from_metadata(
        {
            "files": {"a.py": "x = 1\n", "pkg/b.py": ""},
            "git": {"repo": "/src/repo", "rev": "abc123"},
            "grade_files": {"test_a.py": "assert True\n"},
            "grade_command": "python3 test_a.py",
        },
        WHO,
    )
    assert seed == WorkspaceSeed(
        files={"a.py": "x = 1\n", "pkg/b.py": ""},
        git=GitSource("/src/repo", "abc123"),
        grade_files={"test_a.py": "assert True\n"},
        grade_command="python3 test_a.py",
    )
    assert WorkspaceSeed.from_metadata(None, WHO) == WorkspaceSeed()


@pytest.mark.parametrize(
    "metadata, message",
    [
        ({"files": ["a.py"]}, "sample index=7: metadata.files must map relative paths to file contents, got list"),
        ({"files": {"/etc/passwd": "x"}}, "sample index=7: metadata.files: '/etc/passwd' must be a relative path"),
        ({"grade_files": {"../up.py": "x"}}, "sample index=7: metadata.grade_files: '../up.py' must be a relative"),
        ({"files": {"a.py": 3}}, "sample index=7: metadata.files['a.py'] must be the file's text, got int"),
        ({"git": "https://example.com/r.git"}, "sample index=7: metadata.git must be {'repo': path or URL"),
        ({"grade_command": "  "}, "sample index=7: metadata.grade_command must be a non-empty shell command"),
    ],
)
def test_a_malformed_seed_is_refused_naming_the_sample_and_the_field(metadata, message):
    with pytest.raises(WorkspaceError) as e:
        WorkspaceSeed.from_metadata(metadata, WHO)
    assert str(e.value).startswith(message)


paths = st.lists(st.text("abcxyz_", min_size=1, max_size=6), min_size=1, max_size=3).map("/".join)


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(paths, st.text(max_size=50), max_size=5), st.dictionaries(paths, st.text(max_size=50), max_size=5)
)
def test_packed_files_come_back_exactly_and_files_win_over_the_base(base, files):
    if any(
        a != b and (a.startswith(b + "/") or b.startswith(a + "/")) for a in {*base, *files} for b in {*base, *files}
    ):
        return  # a path cannot be a file and a directory at once
    out = unpack(pack(files, base=pack(base)))
    assert out == {p: t.encode() for p, t in {**base, **files}.items()}


def test_a_git_seed_is_the_checkout_of_its_revision_with_files_over_it(tmp_path):
    repo = tmp_path / "repo"
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "m.py").write_text("v = 1\n")
    subprocess.run(git + ["add", "m.py"], check=True)
    subprocess.run(git + ["commit", "-qm", "one"], check=True)
    first = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (repo / "m.py").write_text("v = 2\n")
    subprocess.run(git + ["commit", "-qam", "two"], check=True)
    seed = WorkspaceSeed(files={"extra.txt": "e"}, git=GitSource(str(repo), first))
    out = unpack(seed.tarball())
    assert (out["m.py"], out["extra.txt"]) == (b"v = 1\n", b"e")
    assert any(p.startswith(".git/") for p in out), "the checkout keeps its history"
    with pytest.raises(WorkspaceError, match="metadata.git: .* failed for .* at 'nope'"):
        git_tarball(GitSource(str(repo), "nope"))


def test_the_agent_run_needs_exactly_one_of_an_entry_and_a_command():
    with pytest.raises(ValueError, match="exactly one of --agent-entry .* and --agent-command"):
        AgentRun.of(AgentConfig())
    with pytest.raises(ValueError, match="exactly one of"):
        AgentRun.of(AgentConfig(agent_entry="m.f", agent_command="python3 a.py"))
    assert AgentRun.of(AgentConfig(agent_command="python3 a.py")).command == "python3 a.py"


def test_the_report_counts_branches_per_sample_and_the_mean_reward():
    def s(sid, reward, status=Sample.Status.COMPLETED, **md):
        return Sample(session_id=sid, reward=reward, status=status, metadata=md)

    samples = [
        s("a", 1.0),
        s("a", 1.0),
        s("b", 0.0),
        s("c", None, Sample.Status.FAILED, failure_reason="agent_grading_failed"),
    ]
    summary = summarize(samples)
    assert summary == {
        "samples": 3,
        "reward_mean": 2 / 3,
        "solved": 2,
        "branches_per_sample": [1, 1, 2],
        "failed": {"agent_grading_failed": 1},
    }
    assert format_line(4, summary) == (
        "agent rollout 4: reward mean 0.667 (2 solved) over 3 samples; branches per "
        "sample [1, 1, 2]; failed {'agent_grading_failed': 1}"
    )


def test_the_agent_flags_are_refused_at_start_naming_the_flag(tmp_path):
    from slime.agent.flags import check_agent_args
    from slime.cli.args import ArgError, parse_args

    tasks = str(Path(__file__).resolve().parent.parent / "configs" / "agent_demo" / "tasks.jsonl")
    with pytest.raises(ArgError, match="needs exactly one of --agent-entry"):  # parse_args checks them
        parse_args(["--custom-generate-function-path", "slime.agent.rollout.generate", "--prompt-data", tasks])

    def args(**kw):
        return completed(
            argparse.Namespace(
                **{"agent_command": "true", "custom_generate_function_path": "slime.agent.rollout.generate", **kw}
            )
        )

    with pytest.raises(ValueError, match="--agent-sandbox-ro-path /no/such/dir: no such file or directory"):
        check_agent_args(args(agent_sandbox_ro_path=["/no/such/dir"]))
    with pytest.raises(ValueError, match="--agent-grade-timeout: must be > 0 seconds, got 0"):
        check_agent_args(args(agent_grade_timeout=0))
    with pytest.raises(ValueError, match="--agent-sandbox-concurrency: must be >= 1, got 0"):
        check_agent_args(args(agent_sandbox_concurrency=0))
    check_agent_args(args(agent_sandbox_ro_path=[str(tmp_path)]))
    check_agent_args(args(custom_generate_function_path=None, agent_command=None))  # not the agent rollout


def test_a_bad_workspace_row_is_refused_before_the_run_naming_file_and_line(tmp_path):
    from slime.agent.sandboxes.workspace import check_prompt_rows
    from slime.cli.preflight import PreflightError, check_agent_workspaces

    data = tmp_path / "tasks.jsonl"
    data.write_text(
        '{"prompt": "a", "metadata": {"files": {"a.py": "x"}}}\n'
        '{"prompt": "b", "metadata": {"files": {"../b.py": "x"}}}\n'
    )
    from slime.cli.finalize import complete_namespace

    args = complete_namespace(argparse.Namespace(agent_command="true", prompt_data=str(data), metadata_key="metadata"))
    with pytest.raises(PreflightError, match=rf"--prompt-data: {data}:2: metadata.files: '../b.py' must be a relative"):
        check_agent_workspaces(args)
    demo = Path(__file__).resolve().parent.parent / "configs" / "agent_demo" / "tasks.jsonl"
    assert check_prompt_rows(str(demo), "metadata") == 4
