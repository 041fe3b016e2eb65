"""`make agent-demo`'s inputs, checked without running it (it takes minutes; `tests/test_agent_command.py`
runs its agent at small size): the target's command line is accepted by `slime-train` as written, and
every task of `configs/agent_demo/tasks.jsonl` is a real bug -- its grading command fails on the seeded
file and passes once the function is fixed -- so a demo reward of 0 or 1 means what it says."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "configs" / "agent_demo" / "tasks.jsonl"
FIXES = {  # label -> (file, the fixed function)
    "add": ("add.py", "def add(a, b):\n    return a + b\n"),
    "is_even": ("is_even.py", "def is_even(n):\n    return n % 2 == 0\n"),
    "largest": ("largest.py", "def largest(xs):\n    return max(xs)\n"),
    "shout": ("shout.py", 'def shout(s):\n    return s.upper() + "!"\n'),
}


def tasks() -> list[dict]:
    return [json.loads(line) for line in TASKS.read_text().splitlines() if line.strip()]


def grade(workdir: Path, command: str) -> subprocess.CompletedProcess:
    """The task's grading command on the host, with this interpreter as `python3` (the sandbox's is the host's)."""
    cmd = command.replace("python3", shlex.quote(sys.executable), 1)
    return subprocess.run(cmd, shell=True, cwd=workdir, capture_output=True, text=True, timeout=60)


def write(workdir: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (workdir / rel).write_text(text)


def test_every_demo_task_fails_as_seeded_and_passes_once_fixed(tmp_path):
    assert sorted(t["label"] for t in tasks()) == sorted(FIXES)
    for task in tasks():
        md, workdir = task["metadata"], tmp_path / task["label"]
        workdir.mkdir()
        write(workdir, md["files"])
        write(workdir, md["grade_files"])
        seeded = grade(workdir, md["grade_command"])
        assert seeded.returncode == 1, (task["label"], seeded.stderr)
        assert "FAILED (failures=1)" in seeded.stderr
        path, fixed = FIXES[task["label"]]
        write(workdir, {path: fixed})
        write(workdir, md["grade_files"])
        solved = grade(workdir, md["grade_command"])
        assert solved.returncode == 0, (task["label"], solved.stderr)
        assert solved.stderr.rstrip().endswith("OK")


def demo_argv() -> list[str]:
    """The arguments `make agent-demo` passes to `python -m slime.train` (make -n: printed, not run)."""
    out = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "--no-print-directory", "agent-demo"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    line = next(c for c in out.replace("\\\n", " ").splitlines() if " -m slime.train " in c)
    argv = shlex.split(line)
    return argv[argv.index("slime.train") + 1 :]


def test_the_make_target_command_line_is_accepted_by_slime_train():
    from slime.cli.train import parse_train_args

    argv = demo_argv()
    args = parse_train_args(argv)
    demo_dir = str(ROOT / "configs" / "agent_demo")
    assert args.custom_generate_function_path == "slime.agent.rollout.generate"
    assert args.agent_command == f"{{python}} {demo_dir}/react_agent.py --max-turns 3 --max-tokens 96"
    assert args.agent_sandbox_ro_path == [demo_dir]
    assert args.prompt_data == "configs/agent_demo/tasks.jsonl"
    assert (args.rollout_batch_size, args.n_samples_per_prompt, args.global_batch_size) == (2, 2, 4)
    assert args.custom_rollout_log_function_path == "slime.agent.report.log_rollout"
