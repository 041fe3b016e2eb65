"""An engine killed between two training steps (issue 13): the fleet restarts it, and the
replacement, booted with the weights on disk while the other engine serves the trainer's version, loads
the trainer's last push (kept in Ray's object store for that purpose, issue 31) before it takes a request:
it reports the pushed version and its weights equal the trainer's by checksum, without waiting for the next
push. No sample ever carries the disk weights' version once the trainer has pushed; the next push (slime's
flow: `recover_updatable_engines` -> `get_updatable_engines_and_lock` with `num_new_engines` -> group
re-formed) reaches it like any engine. (Without kept weights it waits in `awaiting_weights` for that push:
tests/test_fleet_awaiting_weights.py, tests/test_fleet_kept_weights.py.)

slime-train's own pieces: the rollout manager, one trainer worker (the distributed path), the tiny model.
"""

from __future__ import annotations

import json

import pytest
import requests

from slime.cli.train import parse_train_args
from slime.testing.manager_probe import (
    batch_weight_versions,
    engine_status,
    manager_and_trainer,
    wait_engine_state,
)


def _served(url: str) -> float:
    """Requests this engine has taken since it started (SGLang's counter)."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("sglang:num_requests_total")
    )


@pytest.fixture
def loop_parts(ray_cluster, engine_fork_server, tiny_model_dir, tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"Count to {i}."}], "label": ""} for i in range(16)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = parse_train_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(tmp_path / "train.jsonl"),
            "--input-key",
            "messages",
            "--label-key",
            "label",
            "--apply-chat-template",
            "--rollout-num-engines",
            "2",
            "--rollout-num-cpus-per-engine",
            "0.5",
            "--engine-threads",
            "1",
            "--actor-num-workers",
            "1",
            "--actor-num-cpus-per-worker",
            "0.5",
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--rollout-max-response-len",
            "6",
            "--global-batch-size",
            "4",
            "--micro-batch-size",
            "2",
            "--lr",
            "5e-2",
            "--custom-rm-path",
            "tests.plugins.train_rewards.even_token_fraction",
            "--num-rollout",
            "3",
            "--log-dir",
            str(tmp_path / "logs"),
            "--engine-max-restarts",
            "2",
        ]
    )
    with manager_and_trainer(args, engine_fork_server) as parts:
        yield parts


def test_killed_engine_serves_only_after_the_current_weights_reach_it(loop_parts):
    import ray

    manager, group = loop_parts
    group.update_weights(manager, "0", "distributed")
    boxes = ray.get(manager.generate.remote(0))
    assert batch_weight_versions(boxes) == {"0"}
    group.train(0, boxes)
    group.update_weights(manager, "1", "distributed")  # version 1: trained weights, not the ones on disk
    trained = group.weight_checksums()

    old_url = engine_status(manager, 0)["url"]
    ray.get(manager.kill_engine.remote(0))
    boxes = ray.get(manager.generate.remote(1))  # engine 0 is restarting meanwhile: only engine 1 serves
    assert batch_weight_versions(boxes) == {"1"}
    assert ray.get(manager.recover_updatable_engines.remote()) == 1  # num_new_engines

    # back with the trainer's version 1, loaded before it was registered
    restarted = wait_engine_state(manager, 0, ("healthy",))
    assert restarted["url"] != old_url and restarted["restarts"] == 1
    url = restarted["url"]
    assert requests.get(f"{url}/get_weight_version", timeout=10).json()["weight_version"] == "1"
    checks = ray.get(manager.check_weights.remote("compare", trained))
    assert [c["equal"] for c in checks] == [True, True], [c["message"] for c in checks]
    boxes = ray.get(manager.generate.remote(2))
    assert batch_weight_versions(boxes) == {"1"} and _served(url) > 0

    # the trainer's next push (slime's flow: recover, engines + num_new_engines, re-formed group) reaches it too
    engines, _lock, num_new, *_ = ray.get(manager.get_updatable_engines_and_lock.remote())
    assert len(engines) == 2 and num_new == 1
    group.update_weights(manager, "2", "distributed")
    assert requests.get(f"{url}/get_weight_version", timeout=10).json()["weight_version"] == "2"
    assert ray.get(manager.get_updatable_engines_and_lock.remote())[2] == 0
