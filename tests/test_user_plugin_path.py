"""A user's repository with its own `examples/` package (slime's layout) runs its plugins on the Ray
workers: the working directory and the user's PYTHONPATH come before our checkout there, our bundled
`examples/` is a namespace package a user's regular one always wins over, and the CLI checks a
plugin with the workers' path (slime.ray.worker_path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from slime.ray.worker_path import package_root, worker_path

ROOT = Path(__file__).resolve().parents[1]
SLIME_ROLLOUT = Path(sys.executable).parent / "slime-rollout"

USER_ROLLOUT = """
from slime.utils.types import Sample


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    groups = data_source.get_samples(args.rollout_batch_size)
    for group in groups:
        for s in group:
            s.tokens, s.response_length, s.response = [1, 2, 3], 1, "user"
            s.reward, s.status = 0.25, Sample.Status.COMPLETED
    print("USER-PLUGIN-RAN", __file__, flush=True)
    return groups
"""


def user_repo(tmp_path: Path) -> Path:
    """slime's layout: `examples/` with `__init__.py`, a recipe our checkout does not have, and a
    `multi_agent` recipe of the same name as one of ours."""
    repo = tmp_path / "user-repo"
    for pkg in ("examples", "examples/geo3k_vlm_multi_turn", "examples/multi_agent"):
        (repo / pkg).mkdir(parents=True)
        (repo / pkg / "__init__.py").write_text("")
    (repo / "examples/geo3k_vlm_multi_turn/rollout.py").write_text(USER_ROLLOUT)
    (repo / "examples/multi_agent/rollout_with_multi_agents.py").write_text("WHOSE = 'user'\n")
    return repo


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # slime comes from the install
    return {**env, **extra}


def test_a_user_examples_package_wins_over_ours_wherever_it_is_on_the_path(tmp_path):
    """Our `examples/` is a namespace package: the user's regular package wins even with our
    checkout earlier on the path; with no user package ours are still importable."""
    repo = user_repo(tmp_path)
    probe = (
        "import examples.multi_agent.rollout_with_multi_agents as m, examples.geo3k_vlm_multi_turn.rollout;"
        "print(m.WHOSE)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=clean_env(PYTHONPATH=os.pathsep.join([str(ROOT), str(repo)])),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "user"
    ours = subprocess.run(
        [sys.executable, "-c", "import examples.multi_agent.rollout_with_multi_agents as m;print(m.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout.strip() == str(ROOT / "examples/multi_agent/rollout_with_multi_agents.py")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c/d", "", "user-repo", "."]), max_size=5))
def test_worker_path_order(entries):
    """Working directory first, then the user's PYTHONPATH in its order, our checkout never before
    them; no entry twice."""
    cwd = "/work/somewhere"
    env = {"PYTHONPATH": os.pathsep.join(entries)}
    path = worker_path(cwd, env)
    user = [os.path.abspath(e) for e in entries if e]
    assert path[0] == cwd
    assert len(path) == len(set(path))
    assert [p for p in path if p in user] == list(dict.fromkeys(p for p in user if p != cwd))
    if package_root() in path and package_root() not in user:
        assert path[-1] == package_root()


def test_the_cli_checks_a_plugin_where_the_workers_import_it(tmp_path):
    """A console script's `sys.path` starts with its `bin/`; the workers start in the working
    directory. The check used to refuse a plugin of the working directory the workers would run.
    A plugin nobody can import still fails there, naming its flag, before Ray starts."""
    repo = user_repo(tmp_path)
    (repo / "p.jsonl").write_text(json.dumps({"input": "hi", "label": "1"}) + "\n")
    out = subprocess.run(
        [
            str(SLIME_ROLLOUT),
            "--prompt-data",
            "p.jsonl",
            "--label-key",
            "label",
            "--rollout-function-path",
            "examples.geo3k_vlm_multi_turn.rollout.generate_rollout",
            "--custom-rm-path",
            "examples.geo3k_vlm_multi_turn.nowhere.reward",
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
    )
    assert out.returncode == 1, out.stderr
    assert "--rollout-function-path" not in out.stderr  # it imported; the next plugin stops the run
    assert "--custom-rm-path 'examples.geo3k_vlm_multi_turn.nowhere.reward': cannot import" in out.stderr
    assert "RolloutManager" not in out.stdout + out.stderr


def test_user_examples_plugin_runs_on_the_workers(tmp_path, tiny_model_dir):
    """The issue's run: the user's repository on PYTHONPATH, started from another directory, through
    the real RolloutManager actor. Our checkout came first on the workers' path and its `examples`
    hid the user's: `No module named 'examples.geo3k_vlm_multi_turn'` inside the actor."""
    repo = user_repo(tmp_path)
    elsewhere = tmp_path / "run-dir"
    elsewhere.mkdir()
    (elsewhere / "p.jsonl").write_text(json.dumps({"input": "hi", "label": "1"}) + "\n")
    out = subprocess.run(
        [
            str(SLIME_ROLLOUT),
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            "p.jsonl",
            "--label-key",
            "label",
            "--rm-type",
            "exact",
            "--rollout-batch-size",
            "1",
            "--n-samples-per-prompt",
            "1",
            "--rollout-function-path",
            "examples.geo3k_vlm_multi_turn.rollout.generate_rollout",
            "--rollout-num-engines",
            "1",
            "--engine-threads",
            "1",
            "--rollout-num-cpus-per-engine",
            "0.5",
            "--num-rollout",
            "1",
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env=clean_env(PYTHONPATH=str(repo)),
        timeout=600,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert f"USER-PLUGIN-RAN {repo / 'examples/geo3k_vlm_multi_turn/rollout.py'}" in text
    assert "mean_reward=0.2500" in text
