"""An engine killed during a weight push, in slime-train's own pieces (issue 20, item 7): the rollout
manager with two embedded engines, one trainer worker pushing by the distributed path (shared-memory
ring), the tiny model. The push notices the death at once (the fleet's exit notice), finishes to the
survivor, the fleet restarts the engine, the replacement loads the push the trainer kept (issue 31: it
serves the trainer's weights at once, checksums equal) and the next push reaches both; the run goes on."""

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


@pytest.fixture
def parts(ray_cluster, engine_fork_server, tiny_model_dir, tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"Count to {i}."}], "label": ""} for i in range(8)]
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
            "4",
            "--global-batch-size",
            "4",
            "--micro-batch-size",
            "2",
            "--lr",
            "5e-2",
            "--custom-rm-path",
            "tests.plugins.train_rewards.even_token_fraction",
            "--num-rollout",
            "2",
            "--log-dir",
            str(tmp_path / "logs"),
            "--engine-max-restarts",
            "2",
            "--update-weight-buffer-size",
            str(64 << 10),
        ]
    )  # many buckets: the death lands mid-push
    # engines and their replacement fork warm from the session's fork server (the model preloaded once)
    with manager_and_trainer(args, engine_fork_server) as parts:
        yield parts


def test_engine_killed_mid_push_the_run_goes_on(parts):
    import ray

    manager, group = parts
    group.update_weights(manager, "0", "distributed")
    group.train(0, ray.get(manager.generate.remote(0)))
    old_url = engine_status(manager, 1)["url"]
    ray.get(manager.kill_engine_during_push.remote(1, 4))  # SIGKILL at the 4th bucket of the next push
    out = group.update_weights(manager, "1", "distributed")
    assert out["engines_died"] == [f"engine at {old_url}"] and out["engines"] == 1
    trained = group.weight_checksums()
    survivor = engine_status(manager, 0)["url"]
    check = requests.post(
        f"{survivor}/weights_checker", json={"action": "compare", "checksums": trained}, timeout=60
    ).json()
    assert check["equal"], check["message"]

    # the fleet restarts it; it loads the push the trainer kept and serves, without waiting for the next one
    replaced = wait_engine_state(manager, 1, ("healthy",))
    assert replaced["url"] != old_url and replaced["restarts"] == 1
    checks = ray.get(manager.check_weights.remote("compare", trained))
    assert [c["equal"] for c in checks] == [True, True], [c["message"] for c in checks]
    out = group.update_weights(manager, "1", "distributed")  # the next push re-forms the group with it
    assert out["engines"] == 2 and out["engines_died"] == []
    checks = ray.get(manager.check_weights.remote("compare", trained))
    assert [c["equal"] for c in checks] == [True, True], [c["message"] for c in checks]
    boxes = ray.get(manager.generate.remote(1))  # the run goes on, on both engines
    assert batch_weight_versions(boxes) == {"1"}
