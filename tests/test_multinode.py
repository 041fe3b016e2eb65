"""A real multi-raylet Ray cluster on this machine (`ray.cluster_utils.Cluster`: one raylet per node, each
with its own CPUs and node id). slime joins it with `--ray-address` and never stops it; the manager and
its router go to the head, the engines to a second node, the trainer's workers to a third. Then the
engines' node is killed in the middle of a rollout: its engines move to the surviving node, nothing is lost
or returned twice, and the trainer pushes its weights to them over a group formed again.

The scenario runs in a process of its own (`python -m tests.test_multinode MODEL_DIR WORK_DIR`, which
prints one JSON line of facts): a Ray driver joins one cluster, and this test process may already have
joined the suite's single-node Ray. The assertions are here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

ROOT = Path(__file__).resolve().parents[1]
N_PROMPTS, N_SAMPLES, MAX_LEN = 3, 2, 8
# the head notices a dead raylet within ~2 s (Ray's defaults: 3 s x 5 checks)
FAST_NODE_DEATH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                   "health_check_timeout_ms": 1000, "health_check_failure_threshold": 3}


@pytest.mark.slow
def test_engines_node_lost_mid_rollout_engines_move_nothing_lost_cluster_left_running(tiny_model_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "tests.test_multinode", str(tiny_model_dir), str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-8000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    head, engines_node, trainer_node = facts["nodes"]["head"], facts["nodes"]["engines"], facts["nodes"]["trainer"]
    assert len({head, engines_node, trainer_node}) == 3

    # placed as slime places them: manager + router on the head, engines on node 2, trainer on node 3
    assert facts["manager_node"] == head
    assert facts["router_pid_is_managers_child"]
    assert [e["node_id"] for e in facts["before"]["engines"]] == [engines_node, engines_node]
    assert facts["trainer_nodes"] == [trainer_node]

    # the kill landed mid-rollout: requests were waiting on the engines
    assert facts["held_requests_at_kill"] >= 1

    # nothing lost, nothing twice: the rollout during the loss and the next one are whole
    n = N_PROMPTS * N_SAMPLES
    for rollout in ("during_loss", "after"):
        got = facts[rollout]
        assert got["samples"] == n and len(set(got["sample_indices"])) == n, got
        assert got["failed"] == 0 and all(0 < x <= MAX_LEN for x in got["response_lengths"]), got
    assert facts["during_loss"]["engine_retries"] >= 1
    assert facts["trained"] == {"rollout_id": 0, "steps": 1}  # one step over the global batch of n: each once
    # the trainer's group re-formed over the moved engines: they hold its weights and answer with them
    assert facts["versions_after_push"] == ["1", "1"] and facts["after"]["weight_versions"] == ["1"]

    # status() names the node that went and where its engines are now
    st = facts["after_status"]
    assert [lost["node_id"] for lost in st["lost_nodes"]] == [engines_node]
    [lost] = st["lost_nodes"]
    assert sorted(lost["engines"]) == [0, 1]
    assert {int(k): v for k, v in lost["moved_to"].items()} == {0: trainer_node, 1: trainer_node}
    assert [(e["state"], e["node_id"], e["moved_from"], e["deaths"]) for e in st["engines"]] == \
        [("healthy", trainer_node, engines_node, 1)] * 2
    assert st["engine_deaths"] == 2 and sorted(st["engine_urls"]) == sorted(e["url"] for e in st["engines"])

    # --ray-address: slime stopped its manager, trainer and engines, never the cluster
    assert facts["alive_after_slime_stopped"] == sorted([head, trainer_node])
    assert facts["slime_actors_left"] == []


# ---- the scenario, in its own process ----------------------------------------------------------------
def _argv(model_dir: str, work: Path, address: str) -> list[str]:
    data = work / "train.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} plus {i}?"}],
                                        "label": str(2 * i)}) + "\n" for i in range(8)))
    return ["--ray-address", address, "--rollout-backend", "hf", "--hf-checkpoint", model_dir,
            "--prompt-data", str(data), "--input-key", "messages", "--label-key", "label", "--apply-chat-template",
            "--rm-type", "exact", "--rollout-num-engines", "2", "--rollout-num-cpus-per-engine", "1",
            "--engine-threads", "1", "--rollout-batch-size", str(N_PROMPTS), "--n-samples-per-prompt",
            str(N_SAMPLES), "--rollout-max-response-len", str(MAX_LEN), "--request-retry-window", "600",
            "--request-max-retries", "10000", "--actor-num-workers", "1", "--actor-num-cpus-per-worker", "1",
            "--global-batch-size", str(N_PROMPTS * N_SAMPLES), "--micro-batch-size", "2",
            "--log-dir", str(work / "logs")]


def _batch_facts(batch: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    return {"samples": len(batch["tokens"]), "sample_indices": list(batch["sample_indices"]),
            "response_lengths": list(batch["response_lengths"]), "failed": summary["failed"],
            "engine_retries": summary["engine_retries"],
            "weight_versions": sorted({v for vs in batch["weight_versions"] for v in vs})}


def _hold_requests(urls: list[str]) -> int:
    """Pause the engines, so the rollout's requests wait on them; return once some are waiting."""
    for url in urls:
        requests.post(f"{url}/pause_generation", json={}, timeout=10).raise_for_status()
    deadline = time.monotonic() + 120
    while not (held := sum(requests.get(f"{u}/get_load", timeout=5).json().get("num_reqs", 0) for u in urls)):
        assert time.monotonic() < deadline, "no request reached the paused engines"
        time.sleep(0.05)
    return held


def scenario(model_dir: str, work: Path) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    from slime.cli.args import parse_args
    from slime.ray.session import ray_init, start_manager, stop_manager
    from slime.train.actor_group import TrainGroup
    from slime.utils.misc import find_free_port

    node_args = {"include_dashboard": False, "object_store_memory": 80 * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "num_cpus": 0, "gcs_server_port": find_free_port(),
                                                            "_system_config": FAST_NODE_DEATH})
    facts: dict[str, Any] = {}
    try:
        engines_node = cluster.add_node(num_cpus=2, **node_args)  # only it has room for the engines
        args = parse_args(_argv(model_dir, work, cluster.address))
        session = ray_init(args)
        assert not session.started  # joined, not started
        manager, info = start_manager(args)
        trainer_node = cluster.add_node(num_cpus=3, **node_args)  # the trainer's, with room for 2 engines
        facts["nodes"] = {"head": cluster.head_node.node_id, "engines": engines_node.node_id,
                          "trainer": trainer_node.node_id}
        facts["manager_node"] = _actor_node(manager)
        facts["router_pid_is_managers_child"] = ray.get(manager.router_pid.remote()) in _children_of_manager(
            manager)
        facts["before"] = ray.get(manager.status.remote())
        trainer = TrainGroup(args)
        trainer.start()
        facts["trainer_nodes"] = [_actor_node(w) for w in trainer.workers]
        ray.get(manager.set_train_parallel_config.remote({"dp_size": 1}))

        ref = manager.generate.remote(0)
        facts["held_requests_at_kill"] = _hold_requests(info["engine_urls"])
        cluster.remove_node(engines_node, allow_graceful=False)
        [box] = ray.get(ref)
        batch = ray.get(box.inner)
        facts["during_loss"] = _batch_facts(batch, ray.get(manager.last_summary.remote()))
        metrics = trainer.train(0, [box])
        facts["trained"] = {"rollout_id": metrics["rollout_id"], "steps": len(metrics["steps"])}

        deadline = time.monotonic() + 300
        while any(e["state"] != "healthy" for e in ray.get(manager.status.remote())["engines"]):
            assert time.monotonic() < deadline, f"engines not replaced: {ray.get(manager.status.remote())}"
            time.sleep(0.2)
        # the trainer's group is formed again over the moved engines: a distributed push reaches both
        trainer.update_weights(manager, "1", "distributed")
        facts["versions_after_push"] = [requests.get(f"{e['url']}/get_weight_version", timeout=10).json()
                                        ["weight_version"] for e in ray.get(manager.status.remote())["engines"]]
        [box] = ray.get(manager.generate.remote(1))
        facts["after"] = _batch_facts(ray.get(box.inner), ray.get(manager.last_summary.remote()))
        facts["after_status"] = ray.get(manager.status.remote())

        trainer.shutdown()
        stop_manager(manager)
        session.stop()
        facts["alive_after_slime_stopped"] = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        facts["slime_actors_left"] = _actors_left()
    finally:
        ray.shutdown()
        cluster.shutdown()
    return facts


def _actors_left(within: float = 60.0) -> list[str]:
    """Classes of the actors still alive once those the killed manager owned had `within` s to go
    (Ray stops an owner's actors after it, not with it)."""
    import ray

    deadline = time.monotonic() + within
    while (left := [a["ActorClassName"] for a in ray._private.state.actors().values() if a["State"] == "ALIVE"]) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _actor_info(actor: Any) -> dict[str, Any]:
    """Ray's record of a live actor: its node and process."""
    import ray

    return ray._private.state.actors(actor._actor_id.hex())


def _actor_node(actor: Any) -> str:
    return _actor_info(actor)["Address"]["NodeID"]


def _children_of_manager(manager: Any) -> list[int]:
    import psutil

    pid = _actor_info(manager)["Pid"]
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(scenario(sys.argv[1], Path(sys.argv[2]))), flush=True)
