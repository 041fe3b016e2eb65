"""A fast-failing start (issue 20, item 10): a placement the cluster can never grant fails at once with
the arithmetic, and the rollout manager resolves a missing --hf-checkpoint however it is built.

The session's Ray cluster has 8 CPUs on one node (tests/conftest.py)."""

from __future__ import annotations

import pytest

from slime.cli.args import parse_args
from slime.cli.train import parse_train_args
from slime.fleet.placement import PlacementError, reserve
from slime.train.actor_group import TrainGroup
from slime.train.flags import WorkerConfig


def _train_args(tmp_path, tiny_model_dir, *extra: str):
    (tmp_path / "p.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}], "label": ""}\n')
    return parse_train_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(tmp_path / "p.jsonl"),
            "--input-key",
            "messages",
            "--label-key",
            "label",
            *extra,
        ]
    )


def _trainer_placement_groups() -> set[str]:
    """Every trainer placement group this Ray has seen, removed ones included."""
    from ray.util.placement_group import placement_group_table

    return {pg_id for pg_id, e in placement_group_table().items() if e["name"].startswith("slime-trainer#")}


def test_trainer_beyond_the_cluster_fails_at_once_with_the_arithmetic(ray_cluster, tmp_path, tiny_model_dir):
    import ray

    engines = reserve([{"CPU": 1.0}] * 3, name="slime-engines", what="the engines", flags="--rollout-num-engines")
    try:
        args = _train_args(tmp_path, tiny_model_dir, "--actor-num-workers", "2", "--actor-num-cpus-per-worker", "3")
        group = TrainGroup(WorkerConfig.from_args(args), args)
        trainer_groups_before = _trainer_placement_groups()
        with pytest.raises(PlacementError) as err:
            group.start()
        # refused before any reservation was asked for, so the 120 s placement wait never began (the event, not
        # the clock: a loaded box stretches any time bound); the wait's own error would read "could not reserve"
        assert _trainer_placement_groups() == trainer_groups_before
        assert str(err.value) == (
            "cannot place the trainer: 2 bundle(s) of 3 CPU = 6 CPU + 3 CPU held by "
            "slime-engines = 9 CPU, but the cluster has 8 CPU in total "
            "(check --actor-num-workers / --actor-num-cpus-per-worker)"
        )
        assert group.pg is None and group.workers == []
        assert not [
            e
            for e in ray.util.placement_group_table().values()
            if e["name"].startswith("slime-trainer#") and e["state"] != "REMOVED"
        ]
    finally:
        ray.util.remove_placement_group(engines)


def test_bundle_larger_than_any_node_and_a_grantable_reservation(ray_cluster):
    import ray

    with pytest.raises(
        PlacementError,
        match=r"^cannot place the engines: a bundle needs 9 CPU, the largest node "
        r"has 8 CPU \(check --rollout-num-cpus-per-engine\)$",
    ):
        reserve([{"CPU": 9.0}], name="slime-engines", what="the engines", flags="--rollout-num-cpus-per-engine")
    pg = reserve([{"CPU": 4.0}, {"CPU": 4.0}], name="slime-engines", what="the engines", flags="-")
    try:  # exactly the cluster: granted
        assert ray.util.placement_group_table(pg)["state"] == "CREATED"
    finally:
        ray.util.remove_placement_group(pg)


def test_manager_resolves_a_missing_hf_checkpoint_like_the_commands(tmp_path, monkeypatch):
    """slime's train.py way: parse_args, then RolloutManager(args), no --hf-checkpoint."""
    from slime.engine import default_model
    from slime.ray.rollout_manager import RolloutManager

    cached = tmp_path / "models" / default_model.MODEL_NAME  # an already converted default model
    cached.mkdir(parents=True)
    (cached / default_model._DONE_MARKER).write_text("ok\n")
    monkeypatch.setenv("SLIME_CACHE", str(tmp_path))
    manager = RolloutManager(parse_args(["--rollout-backend", "hf"]))
    assert manager.args.hf_checkpoint == str(cached)
    # parse_args refuses SGLang without a checkpoint; args built or changed by a caller reach the manager
    sglang = parse_args(["--rollout-backend", "sglang", "--rollout-num-gpus", "1", "--hf-checkpoint", str(cached)])
    sglang.hf_checkpoint = None
    with pytest.raises(ValueError, match=r"^--hf-checkpoint is required with --rollout-backend sglang \(only"):
        RolloutManager(sglang)
