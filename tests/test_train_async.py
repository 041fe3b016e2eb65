"""`slime-train --async` (slime's train_async.py): rollout k+1 generates while rollout k trains, with
the fully-async rollout worker in the manager, on the tiny model (real Ray, router, embedded engine).

Checked: the run completes; each record names the weight version its rollout was generated with
(one behind the trainer after the first) and every sample carries a version no newer than that;
the engines hold the trainer's weights after every push; --async with --colocate is refused
before anything starts, naming both flags.
"""

from __future__ import annotations

import pytest

from slime.cli.args import ArgError
from slime.cli.train import parse_train_args
from slime.rollout.debug_data import load_debug_rollout
from slime.train.loop import train
from tests.test_train_loop import argv, prompts  # noqa: F401 - the train test's data and settings

N_ROLLOUT = 3
N_PROMPTS, N_SAMPLES = 2, 2  # a rollout of 4 samples (the train test's 16 are for its reward curve); the pool of
# --sglang-server-concurrency 4 groups is two rollouts' worth, so groups are in flight across every rollout boundary


def test_async_training_overlaps_and_records_versions(
    ray_cluster, engine_fork_server, tiny_model_dir, prompts, tmp_path
):  # noqa: F811
    args = parse_train_args(
        argv(
            tiny_model_dir,
            prompts,
            tmp_path,
            "--rollout-num-engines",
            "1",
            "--actor-num-workers",
            "1",
            "--num-rollout",
            str(N_ROLLOUT),
            "--async",
            "--rollout-function-path",
            "slime.rollout.fully_async_rollout.generate_rollout_fully_async",
            "--sglang-server-concurrency",
            "4",
            "--max-staleness",
            "1",
            "--rollout-batch-size",
            str(N_PROMPTS),
            "--n-samples-per-prompt",
            str(N_SAMPLES),
            "--global-batch-size",
            str(N_PROMPTS * N_SAMPLES),
        )
    )
    records = train(args, fork_server=engine_fork_server)
    assert [r.rollout_id for r in records] == list(range(N_ROLLOUT))
    # rollout 0 by the initial weights; rollout k+1 launched before rollout k trained: version k
    assert [r.weight_version for r in records] == ["0", "0", "1"]
    assert [r.staleness for r in records] == [0, 1, 1]
    for r in records:
        assert all(c["equal"] for c in r.weight_check)
        assert {c["weight_version"] for c in r.weight_check} == {str(r.rollout_id + 1)}
        samples = load_debug_rollout(str(tmp_path / "debug" / "rollout_{rollout_id}.pt"), r.rollout_id)
        n = N_PROMPTS * N_SAMPLES
        assert len(samples) == n and len({s.index for s in samples}) == n
        used = {int(v) for s in samples for v in s.weight_versions}
        # nothing newer than what served at launch (no push lands mid-generation); within --max-staleness 1
        assert used and max(used) <= int(r.weight_version) and min(used) >= int(r.weight_version) - 1, (
            r.rollout_id,
            used,
        )


def test_async_refuses_colocate_before_starting_anything(tiny_model_dir, prompts, tmp_path):  # noqa: F811
    flags = argv(tiny_model_dir, prompts, tmp_path, "--num-rollout", "1", "--async", "--colocate")
    with pytest.raises(ArgError, match="--async .* --colocate or --async"):  # the CLI: exit code 2
        parse_train_args(flags)
    args = parse_train_args([f for f in flags if f != "--colocate"])
    args.colocate = True  # a caller of train() that skipped the CLI's check
    with pytest.raises(ValueError, match="--async .* --colocate or --async"):
        train(args)
