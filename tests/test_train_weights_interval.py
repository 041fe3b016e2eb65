"""`--update-weights-interval N` (slime's flag, default 1): `slime-train` pushes the weights only after
rollouts whose `rollout_id + 1` is a multiple of N, in the synchronous loop and with `--async`
(slime's train_async.py rule), on the tiny model (real Ray, router, embedded engine, one trainer).

Checked: the weight version every sample carries changes only every N rollouts; a rollout after
which no push is due records none (no weight check, no push time); after each push every engine's
weights equal the trainer's; with --async a generation that is not followed by a push keeps running
across the rollout boundary; a bad value or an offloading combination is refused before anything
starts, naming the flag.
"""

from __future__ import annotations

import pytest

from slime.cli.args import ArgError
from slime.cli.train import parse_train_args
from slime.rollout.debug_data import load_debug_rollout
from slime.train.loop import train, weights_due
from tests.test_train_loop import argv, prompts  # noqa: F401 - the train test's data and settings

N_ROLLOUT, INTERVAL = 4, 2
# 2 prompts x 2 samples a rollout (the train test's 16 are for its reward curve): what is checked here is the
# version every sample carries, which holds for any rollout size, and each run costs a quarter of the generation
SMALL_ROLLOUT = ("--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4")
N_SAMPLES = 4


def _run(fork_server, tiny_model_dir, prompts, tmp_path, *extra):  # noqa: F811
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
            "--update-weights-interval",
            str(INTERVAL),
            *SMALL_ROLLOUT,
            *extra,
        )
    )
    assert args.update_weights_interval == INTERVAL
    return train(args, fork_server=fork_server)


def _sample_versions(tmp_path, rollout_id: int) -> set[tuple[str, ...]]:
    samples = load_debug_rollout(str(tmp_path / "debug" / "rollout_{rollout_id}.pt"), rollout_id)
    assert len(samples) == N_SAMPLES
    return {tuple(s.weight_versions) for s in samples}


def _check_pushes(records) -> None:
    """Pushes after rollouts 1 and 3 (versions "2" and "4"), each checked equal on every engine."""
    assert [r.pushed_version for r in records] == [None, "2", None, "4"]
    for r in records:
        if r.pushed_version is None:
            assert r.weight_check is None and r.update_weights_time == 0.0
            assert "update_weights=skipped" in r.line()
        else:
            assert r.weight_check and all(c["equal"] for c in r.weight_check), r.weight_check
            assert {c["weight_version"] for c in r.weight_check} == {r.pushed_version}


@pytest.mark.parametrize("async_train", [False, True], ids=["sync", "async"])
def test_weights_pushed_every_n_rollouts(
    ray_cluster,
    engine_fork_server,
    tiny_model_dir,
    prompts,  # noqa: F811
    tmp_path,
    async_train,
):
    records = _run(engine_fork_server, tiny_model_dir, prompts, tmp_path, *(["--async"] if async_train else []))
    assert [r.rollout_id for r in records] == list(range(N_ROLLOUT))
    _check_pushes(records)
    if async_train:
        # rollout 1 launched while 0 trained (no push after 0) and rollout 2 while 1 trained, before the
        # push that follows 1: both by version "0"; rollout 3 launched after that push: version "2"
        expected = ["0", "0", "0", "2"]
    else:
        expected = ["0", "0", "2", "2"]
    assert [r.weight_version for r in records] == expected
    assert [r.staleness for r in records] == [i - int(v) for i, v in enumerate(expected)]
    for r in records:
        # no push lands in the middle of a generation: every sample of a rollout has its version
        assert r.sample_weight_versions == [r.weight_version]
        assert _sample_versions(tmp_path, r.rollout_id) == {(r.weight_version,)}


@pytest.mark.parametrize(
    "rollout_id,interval,due",
    [(0, 1, True), (5, 1, True), (0, 2, False), (1, 2, True), (2, 3, True), (3, 3, False), (5, 3, True)],
)
def test_push_rule_is_slimes(rollout_id, interval, due):
    assert weights_due(rollout_id, interval) is due


def test_bad_interval_and_offloading_are_refused_before_starting(tiny_model_dir, prompts, tmp_path):  # noqa: F811
    base = argv(tiny_model_dir, prompts, tmp_path, "--num-rollout", "1")
    with pytest.raises(ArgError, match=r"--update-weights-interval must be an integer >= 1 .* got 0"):
        parse_train_args([*base, "--update-weights-interval", "0"])
    with pytest.raises(ArgError, match=r"--update-weights-interval 2 with --colocate"):
        parse_train_args([*base, "--update-weights-interval", "2", "--colocate"])
    args = parse_train_args([*base, "--update-weights-interval", "2"])
    args.update_weights_interval = -1  # a caller of train() that skipped the CLI's check
    with pytest.raises(ValueError, match="--update-weights-interval must be an integer >= 1"):
        train(args)
