"""The suite's random order keeps a folder's files together (slime/testing/suite_order.py), so the package
fixtures of tests/weight_sync (a fork server and three engines) are set up once per run, not once per file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from slime.testing.suite_order import group_by_folder

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ["tests", "tests/weight_sync", "tests/other"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(FOLDERS), st.integers(0, 5)), max_size=30))
def test_each_folder_is_consecutive_and_keeps_its_order(drawn):
    items = [SimpleNamespace(path=Path(folder) / f"test_{module}.py", n=n) for n, (folder, module) in enumerate(drawn)]
    out = group_by_folder(items)
    assert sorted(i.n for i in out) == list(range(len(items)))  # every item, once
    folders = [i.path.parent for i in out]
    runs = [f for k, f in enumerate(folders) if k == 0 or folders[k - 1] != f]
    assert len(runs) == len(set(runs))  # one run of items per folder
    assert runs == list(dict.fromkeys(i.path.parent for i in items))  # folders where the shuffle first reached them
    for folder in set(folders):  # within a folder, the shuffled order
        assert [i.n for i in out if i.path.parent == folder] == [i.n for i in items if i.path.parent == folder]


def test_the_shuffled_suite_runs_the_weight_sync_files_one_after_the_other():
    """pytest-randomly's seed 3 puts tests/weight_sync's four files apart from each other, between these two."""
    files = ["tests/test_suite_order.py", "tests/weight_sync", "tests/test_hypothesis_profile.py"]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "randomly",
            "-p",
            "no:cacheprovider",
            "--randomly-seed=3",
            *files,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    assert ids, out.stdout[-2000:] + out.stderr[-2000:]
    modules = [i.split("::")[0] for i in ids]
    order = [m for k, m in enumerate(modules) if k == 0 or modules[k - 1] != m]
    assert len(order) == 6 and len(set(order)) == 6, order  # each module's tests together
    in_package = [m.startswith("tests/weight_sync/") for m in order]
    start = in_package.index(True)
    assert in_package[start : start + 4] == [True] * 4, order


def test_xdist_hands_a_worker_each_sub_folder_whole():
    from slime.testing.suite_order import xdist_scope

    assert xdist_scope("tests/test_a.py::test_x[1-2]") == "tests/test_a.py"
    assert xdist_scope("tests/weight_sync/test_tensor_updates.py::test_y") == "tests/weight_sync"
    assert xdist_scope("tests/weight_sync/test_distributed_updates.py::test_z[a/b]") == "tests/weight_sync"


def test_two_workers_run_a_sub_folders_files_on_one():
    """tests/upstream_verl's two files (fast ones) on one worker: under plain `loadfile` they went to two."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadfile",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "-v",
            "tests/upstream_verl",
            "tests/test_suite_order.py::test_xdist_hands_a_worker_each_sub_folder_whole",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    ran = [line.split()[0] for line in out.stdout.splitlines() if "PASSED tests/upstream_verl/" in line]
    assert len(ran) == 29 and len(set(ran)) == 1, out.stdout[-3000:] + out.stderr[-2000:]
