"""A real multi-raylet Ray cluster on this machine (`ray.cluster_utils.Cluster`: one raylet per node, each
with its own CPUs and node id). slime joins it with `--ray-address` and never stops it; the manager goes to
the head, the router (`--router-resource`) to a node of its own, the engines to a third, the trainer's
workers to a fourth. Then, in one run on that one cluster:
1. the engines' node and the router's node are killed together in the middle of a rollout: the engines
   move to the spare node, the router to the manager's node, and the rollout is whole;
2. the spare node is killed in the middle of the next rollout when no node has room: the pool is empty
   until a new node (the same resources) joins, which takes the engines; that rollout is whole too;
3. the trainer's group is formed again over the moved engines and its push reaches them.

Engines start warm, forked from one engine fork server (slime.engine.warm_start) as `slime-train` starts
them on its own Ray: every node of this cluster is this machine. An engine still runs in its node's Ray
actor's lifetime (the actor's connection is the forked child's lifeline), so a lost node takes its engines.
Engines started cold, as `--ray-address` starts them (children of their node's actors), are lost with a node
in tests/test_multinode_push.py.

The scenario runs once per module, in a process of its own (`python -m tests.test_multinode MODEL_DIR
WORK_DIR`, which prints one JSON line of facts): a Ray driver joins one cluster, and this test process may
already have joined the suite's single-node Ray. The tests below assert its facts.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

ROOT = Path(__file__).resolve().parents[1]
N_PROMPTS, N_SAMPLES, MAX_LEN = 3, 2, 8
N = N_PROMPTS * N_SAMPLES
ROUTER_RESOURCE = "slime_router"
# the head notices a dead raylet within ~2 s (Ray's defaults: 3 s x 5 checks)
FAST_NODE_DEATH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster_run(tiny_model_dir, tmp_path_factory) -> dict[str, Any]:
    """The facts of the whole scenario (one cluster for every test of this module) and its log."""
    work = tmp_path_factory.mktemp("multinode")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.test_multinode", str(tiny_model_dir), str(work)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-8000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    facts["log"] = proc.stderr
    print(f"multinode scenario, seconds since start: {facts['seconds']}")  # shown with -s
    return facts


def _whole(got: dict[str, Any]) -> None:
    """Nothing lost, nothing twice: the rollout holds each of its samples once, none failed."""
    assert got["samples"] == N and len(set(got["sample_indices"])) == N, got
    assert got["failed"] == 0 and all(0 < x <= MAX_LEN for x in got["response_lengths"]), got


def test_placed_across_nodes_and_the_cluster_is_left_running(cluster_run):
    facts = cluster_run
    nodes = facts["nodes"]
    assert len(set(nodes.values())) == 6
    # manager on the head, router on its node, engines on theirs, trainer on its own
    assert facts["manager_node"] == nodes["head"]
    assert facts["before"]["router_node_id"] == nodes["router"]
    assert not facts["router_pid_is_managers_child"]
    assert [e["node_id"] for e in facts["before"]["engines"]] == [nodes["engines"]] * 2
    assert facts["trainer_nodes"] == [nodes["trainer"]]
    # --ray-address: slime stopped its manager, router, trainer and engines, never the cluster
    assert facts["alive_after_slime_stopped"] == sorted([nodes["head"], nodes["trainer"], nodes["joined"]])
    assert facts["slime_actors_left"] == []


def test_engines_node_and_router_node_lost_mid_rollout_both_move_nothing_lost(cluster_run):
    facts = cluster_run
    nodes = facts["nodes"]
    assert facts["held_requests_at_first_kill"] >= 1  # the kill landed mid-rollout: requests waited on engines
    got = facts["rollouts"][0]
    _whole(got)
    assert got["engine_retries"] >= 1
    assert facts["trained"][0] == {"rollout_id": 0, "steps": 1}  # one step over the global batch of N: each once
    # the router went to the manager's node (no other node offers the resource), at a new address
    st = facts["status_after_first_loss"]
    assert st["router_node_id"] == nodes["head"] and st["router_url"] != facts["before"]["router_url"]
    assert st["router_url"].startswith("http://127.0.0.1:") and st["router_moves"] == 1
    assert [(e["state"], e["node_id"], e["moved_from"]) for e in st["engines"]] == [
        ("healthy", nodes["spare"], nodes["engines"])
    ] * 2
    lost = {e["node_id"]: e for e in st["lost_nodes"]}
    assert sorted(lost) == sorted([nodes["engines"], nodes["router"]])
    assert sorted(lost[nodes["engines"]]["engines"]) == [0, 1]
    assert {int(k): v for k, v in lost[nodes["engines"]]["moved_to"].items()} == {0: nodes["spare"], 1: nodes["spare"]}
    assert lost[nodes["engines"]]["router_moved_to"] is None
    assert (lost[nodes["router"]]["engines"], lost[nodes["router"]]["router_moved_to"]) == ([], nodes["head"])


def test_a_node_that_joins_takes_the_engines_that_had_no_room_and_the_pool_grows_back(cluster_run):
    facts = cluster_run
    nodes = facts["nodes"]
    assert facts["held_requests_at_second_kill"] >= 1
    # no room anywhere: the pool was empty while the rollout waited
    waiting = facts["status_waiting_for_room"]
    assert waiting["engine_urls"] == [] and all(e["state"] in ("dead", "restarting") for e in waiting["engines"])
    got = facts["rollouts"][1]
    _whole(got)
    assert got["engine_retries"] >= 1
    assert facts["trained"][1] == {"rollout_id": 1, "steps": 1}
    st = facts["after_status"]
    assert [(e["state"], e["node_id"], e["moved_from"], e["deaths"]) for e in st["engines"]] == [
        ("healthy", nodes["joined"], nodes["spare"], 2)
    ] * 2
    assert len(st["engine_urls"]) == 2 and st["engine_deaths"] == 4
    assert (st["nodes_lost"], st["engines_moved"], st["router_moves"]) == (3, 4, 1)
    log = facts["log"]
    assert f"moved from lost node {nodes['spare']} to node {nodes['joined']}" in log
    assert f"on node {nodes['joined']} (restart 2/3); 2 of 2 engines serve" in log


def test_the_trainers_group_reforms_over_the_moved_engines(cluster_run):
    facts = cluster_run
    assert facts["versions_after_push"] == ["1", "1"]
    _whole(facts["rollouts"][2])
    assert facts["rollouts"][2]["weight_versions"] == ["1"]


def test_lost_nodes_are_named_in_the_rollout_line_and_on_the_dashboard(cluster_run):
    facts = cluster_run
    nodes = {k: v[:8] for k, v in facts["nodes"].items()}
    engines_went = f"node {nodes['engines']}: engine 0 -> node {nodes['spare']}, engine 1 -> node {nodes['spare']}"
    router_went = f"node {nodes['router']}: no engine; router -> node {nodes['head']}"
    # the two losses of rollout 0, in the order the fleet noticed them
    both = {f"{engines_went}; {router_went}", f"{router_went}; {engines_went}"}
    second = (
        f"nodes_lost=1 (node {nodes['spare']}: engine 0 -> node {nodes['joined']}, engine 1 -> node {nodes['joined']})"
    )
    lines = facts["lines"]
    assert lines[0].startswith("rollout 0: samples=6 ") and lines[0].split(" nodes_lost=2 (")[1][:-1] in both, lines[0]
    assert lines[1].startswith("rollout 1: samples=6 ") and lines[1].endswith(second), lines[1]
    assert "nodes_lost" not in lines[2]
    fleet = facts["fleet_records"]  # metrics.jsonl: what the wandb run gets
    assert [
        (
            r["rollout_id"],
            r["metrics"]["fleet/nodes_lost"],
            r["metrics"]["fleet/engines_moved"],
            r["metrics"]["fleet/engines_waiting_for_room"],
            r["metrics"]["fleet/router_moves"],
        )
        for r in fleet
    ] == [(0, 2, 2, 0, 1), (1, 1, 2, 0, 0)]
    assert fleet[0]["metrics"]["fleet/lost_nodes"] == lines[0].split(" nodes_lost=2 (")[1][:-1]
    assert fleet[1]["metrics"]["fleet/lost_nodes"] == second[len("nodes_lost=1 (") : -1]
    perf = {r["rollout_id"]: r["metrics"] for r in facts["perf_records"]}
    assert [
        (perf[i]["perf/nodes_lost"], perf[i]["perf/engines_moved"], perf[i]["perf/router_moves"]) for i in range(3)
    ] == [(2, 2, 1), (1, 2, 0), (0, 0, 0)]


# ---- the scenario, in its own process ----------------------------------------------------------------
def _argv(model_dir: str, work: Path, address: str, router_resource: str | None = ROUTER_RESOURCE) -> list[str]:
    """The scenario's flags; `router_resource` None keeps the router on the manager's node."""
    data = work / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"What is {i} plus {i}?"}], "label": str(2 * i)})
            + "\n"
            for i in range(12)
        )
    )
    return [
        "--ray-address",
        address,
        "--rollout-backend",
        "hf",
        "--hf-checkpoint",
        model_dir,
        "--prompt-data",
        str(data),
        "--input-key",
        "messages",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rm-type",
        "exact",
        "--rollout-num-engines",
        "2",
        "--rollout-num-cpus-per-engine",
        "1",
        "--engine-threads",
        "1",
        "--rollout-batch-size",
        str(N_PROMPTS),
        "--n-samples-per-prompt",
        str(N_SAMPLES),
        "--rollout-max-response-len",
        str(MAX_LEN),
        "--request-retry-window",
        "600",
        "--request-max-retries",
        "10000",
        "--actor-num-workers",
        "1",
        "--actor-num-cpus-per-worker",
        "1",
        "--global-batch-size",
        str(N),
        "--micro-batch-size",
        "2",
        "--log-dir",
        str(work / "logs"),
        "--metrics-dir",
        str(work / "metrics"),
    ] + (["--router-resource", router_resource] if router_resource else [])


def _batch_facts(batch: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    return {
        "samples": len(batch["tokens"]),
        "sample_indices": list(batch["sample_indices"]),
        "response_lengths": list(batch["response_lengths"]),
        "failed": summary["failed"],
        "engine_retries": summary["engine_retries"],
        "weight_versions": sorted({v for vs in batch["weight_versions"] for v in vs}),
    }


def _hold_requests(urls: list[str]) -> int:
    """Pause the engines, so the rollout's requests wait on them; return once some are waiting."""
    for url in urls:
        requests.post(f"{url}/pause_generation", json={}, timeout=10).raise_for_status()
    deadline = time.monotonic() + 120
    while not (held := sum(requests.get(f"{u}/get_load", timeout=5).json().get("num_reqs", 0) for u in urls)):
        assert time.monotonic() < deadline, "no request reached the paused engines"
        time.sleep(0.05)
    return held


def _status_when(manager: Any, ready: Any, what: str, within: float = 300.0) -> dict[str, Any]:
    """The manager's status once `ready(status)` holds (the fleet heals on its own: this only watches)."""
    import ray

    deadline = time.monotonic() + within
    while not ready(st := ray.get(manager.status.remote())):
        assert time.monotonic() < deadline, f"{what}: not within {within:.0f}s: {st}"
        time.sleep(0.2)
    return st


def _all_healthy(st: dict[str, Any]) -> bool:
    return all(e["state"] == "healthy" for e in st["engines"])


class Run:
    """One slime run on the cluster: its manager and trainer, and what each rollout gave."""

    def __init__(self, manager: Any, trainer: Any, facts: dict[str, Any]):
        self.manager, self.trainer, self.facts = manager, trainer, facts

    def rollout_with_kill(self, rollout_id: int, kill: Any, held_key: str) -> None:
        """A rollout whose requests are held on the engines when `kill()` runs; then it is trained."""
        import ray

        from slime.cli.rollout import _format_summary

        ref = self.manager.generate.remote(rollout_id)
        urls = ray.get(self.manager.status.remote())["engine_urls"]
        if kill is not None:
            self.facts[held_key] = _hold_requests(urls)
            kill()
        [box] = ray.get(ref)
        summary = ray.get(self.manager.last_summary.remote())
        self.facts["rollouts"].append(_batch_facts(ray.get(box.inner), summary))
        self.facts["lines"].append(_format_summary(summary))
        metrics = self.trainer.train(rollout_id, [box])
        self.facts["trained"].append({"rollout_id": metrics["rollout_id"], "steps": len(metrics["steps"])})


@contextlib.contextmanager
def warm_engines(model_dir: str, work: Path) -> Iterator[str | None]:
    """The socket of an engine fork server preloaded with `model_dir`, for every node's engines and their
    replacements (each cold start imports torch and loads the model again: seconds per engine), or None
    when `SLIME_ENGINE_FORK_SERVER=0` (cold starts). Stopped, with its engines, at the end."""
    from slime.ray.flags import SessionConfig
    from slime.ray.session import RaySession, _await_socket, start_engine_fork_server

    server = start_engine_fork_server(
        SessionConfig(
            rollout_backend="hf",
            hf_checkpoint=model_dir,
            ray_address=None,
            load_debug_rollout_data=None,
            rollout_num_engines=1,
            log_dir=str(work),
        )
    )
    session = RaySession(False, server)
    try:
        yield server.socket_path if server is not None and _await_socket(server) else None
    finally:
        session.stop_fork_server()


def scenario(model_dir: str, work: Path) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    from slime.cli.args import parse_args
    from slime.observability.metrics_log import read_metrics
    from slime.ray.session import ray_init, start_manager, stop_manager
    from slime.train.actor_group import TrainGroup
    from slime.train.flags import WorkerConfig
    from slime.utils.misc import find_free_port

    warm = contextlib.ExitStack()
    node_args = {"include_dashboard": False, "object_store_memory": 80 * 2**20}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            **node_args,
            "num_cpus": 0,
            "gcs_server_port": find_free_port(),
            "_system_config": FAST_NODE_DEATH,
        },
    )
    facts: dict[str, Any] = {"rollouts": [], "lines": [], "trained": [], "seconds": {}}
    t0 = time.monotonic()

    def lap(what: str) -> None:  # where the scenario's time goes (reported by the test run, not asserted)
        facts["seconds"][what] = round(time.monotonic() - t0, 1)

    try:
        router_node = cluster.add_node(num_cpus=0, resources={ROUTER_RESOURCE: 1}, **node_args)
        engines_node = cluster.add_node(num_cpus=2, **node_args)  # only it has room for the engines
        # after the nodes' own starts (a raylet has 30 s to register, a preload competes for the CPU)
        fork_server = warm.enter_context(warm_engines(model_dir, work))
        args = parse_args(_argv(model_dir, work, cluster.address))
        session = ray_init(args)
        assert not session.started  # joined, not started
        manager, info = start_manager(args, fork_server=fork_server)
        trainer_node = cluster.add_node(num_cpus=1, **node_args)  # room for the trainer's worker only
        facts["manager_node"] = _actor_node(manager)
        facts["router_pid_is_managers_child"] = info["router_pid"] in _children_of_manager(manager)
        facts["before"] = ray.get(manager.status.remote())
        lap("cluster and manager up")
        trainer = TrainGroup(WorkerConfig.from_args(args), args)
        trainer.start()
        facts["trainer_nodes"] = [_actor_node(w) for w in trainer.workers]
        ray.get(manager.set_train_parallel_config.remote({"dp_size": 1}))
        spare_node = cluster.add_node(num_cpus=2, **node_args)  # room for both engines
        run = Run(manager, trainer, facts)

        # 1. the engines' node and the router's node go together, mid-rollout
        def lose_engines_and_router() -> None:
            cluster.remove_node(engines_node, allow_graceful=False)
            cluster.remove_node(router_node, allow_graceful=False)

        lap("trainer up")
        run.rollout_with_kill(0, lose_engines_and_router, "held_requests_at_first_kill")
        lap("rollout 0 (engines and router lost) trained")
        facts["status_after_first_loss"] = _status_when(manager, _all_healthy, "engines moved to the spare node")

        # 2. the spare node goes mid-rollout and no node has room: the pool is empty until a node joins
        joined: list[Any] = []

        def lose_spare_then_join() -> None:
            cluster.remove_node(spare_node, allow_graceful=False)
            facts["status_waiting_for_room"] = _status_when(
                manager,
                lambda st: not st["engine_urls"] and all(e["deaths"] == 2 for e in st["engines"]),
                "the spare node's engines reported dead",
            )
            joined.append(cluster.add_node(num_cpus=2, **node_args))  # the same resources as the lost one

        run.rollout_with_kill(1, lose_spare_then_join, "held_requests_at_second_kill")
        lap("rollout 1 (spare lost, a node joined) trained")
        _status_when(manager, _all_healthy, "engines placed on the joined node")

        # 3. the trainer's group is formed again over the moved engines: a distributed push reaches both
        trainer.update_weights(manager, "1", "distributed")
        facts["versions_after_push"] = [
            requests.get(f"{e['url']}/get_weight_version", timeout=10).json()["weight_version"]
            for e in ray.get(manager.status.remote())["engines"]
        ]
        lap("push over the re-formed group")
        run.rollout_with_kill(2, None, "")
        lap("rollout 2 trained")
        facts["after_status"] = ray.get(manager.status.remote())
        facts["nodes"] = {
            "head": cluster.head_node.node_id,
            "router": router_node.node_id,
            "engines": engines_node.node_id,
            "trainer": trainer_node.node_id,
            "spare": spare_node.node_id,
            "joined": joined[0].node_id,
        }
        records = list(read_metrics(work / "metrics"))
        facts["fleet_records"] = [r for r in records if r["kind"] == "fleet"]
        facts["perf_records"] = [r for r in records if r["kind"] == "perf"]

        trainer.shutdown()
        stop_manager(manager)
        session.stop()
        facts["alive_after_slime_stopped"] = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        facts["slime_actors_left"] = _actors_left()
        lap("slime stopped")
    finally:
        ray.shutdown()
        cluster.shutdown()
        warm.close()
    return facts


def _actors_left(within: float = 60.0) -> list[str]:
    """Classes of the actors still alive once those the killed manager owned had `within` s to go
    (Ray stops an owner's actors after it, not with it)."""
    import ray

    deadline = time.monotonic() + within
    while (
        left := [a["ActorClassName"] for a in ray._private.state.actors().values() if a["State"] == "ALIVE"]
    ) and time.monotonic() < deadline:
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
