"""The node holding every engine is lost in the middle of a rollout after the trainer's first pushes, on a
real multi-raylet Ray cluster (issue 31; the cluster is built as in tests/test_multinode.py): the replacements
land on a spare node, load the trainer's last push at once (kept in Ray's object store, version checked) and
serve the rollout, which no engine could serve otherwise; `slime-train`'s loop (`slime.train.loop.train`,
what the command runs) trains all its rollouts, each once. The node loss costs one restart per engine (Ray is
asked about the node before a bundle is reused: none is started on the dead node), is named in the rollout in
which it happened, and the engines are out of service at once.

Ray marks a dead raylet's node dead only after 5 failed health checks 1 s apart here, so the engines' deaths
are seen seconds before (as on a real cluster, where it takes ~15-30 s): what made the first restart land on
the dead node and fail. The scenario runs in a process of its own (`python -m tests.test_multinode_preemption
MODEL_DIR WORK_DIR`, one JSON line of facts): a Ray driver joins one cluster only. Engines, and their
replacements, start warm (tests/test_multinode.py says how).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.test_multinode import N, _argv, warm_engines

ROOT = Path(__file__).resolve().parents[1]
# a killed raylet fails every check at once (its port is closed): its node is marked dead ~5 s after the kill,
# while its engines' deaths are seen within ~1-3 s; a live raylet on this loaded box gets 10 s per check
NODE_DEATH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 10_000,
    "health_check_failure_threshold": 5,
}
WAIT_S = 600.0  # the bound on each wait of the scenario: a failing one names what it waited for
NUM_ROLLOUT = 3
LOST_IN = 1  # the rollout in the middle of which the engines' node is lost (after the pushes of versions 0, 1)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def preemption(tiny_model_dir, tmp_path_factory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("preemption")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.test_multinode_preemption", str(tiny_model_dir), str(work)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-8000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    facts["log"] = proc.stderr
    print(f"preemption scenario, seconds since start: {facts['seconds']}")  # shown with -s
    print(
        "\n".join(
            line
            for line in proc.stderr.splitlines()
            if any(word in line for word in ("is gone", " died ", "loaded weight version", "replaced", "moved from"))
        )
    )
    return facts


def test_every_rollout_is_trained_once_and_the_lost_rollout_is_served_by_the_replacements(preemption):
    facts = preemption
    assert facts["held_at_kill"] >= 1  # the node went while the rollout's requests waited on its engines
    assert [(r["rollout_id"], r["steps"]) for r in facts["records"]] == [(i, 1) for i in range(NUM_ROLLOUT)]
    for i, got in enumerate(facts["batches"]):
        assert got["rollout_id"] == i and got["failed"] == 0, got
        assert got["samples"] == N and len(set(got["sample_indices"])) == N, got
    # served by the replacements with the trainer's version 1 (its last push before the loss), not base weights
    lost = facts["batches"][LOST_IN]
    assert lost["engine_retries"] >= 1 and lost["weight_versions"] == [str(LOST_IN)], lost
    assert facts["records"][LOST_IN]["sample_weight_versions"] == [str(LOST_IN)]
    log = facts["log"]
    for rank in (0, 1):
        assert f"engine {rank}: loaded weight version {LOST_IN} from the trainer's last push" in log
        assert f"engine {rank} replaced at" not in log  # none waited for the next push


def test_one_restart_per_engine_on_the_spare_node(preemption):
    facts = preemption
    nodes = facts["nodes"]
    st = facts["status_at_end"]
    assert [(e["state"], e["node_id"], e["moved_from"], e["restarts"], e["deaths"]) for e in st["engines"]] == [
        ("healthy", nodes["spare"], nodes["engines"], 1, 1)
    ] * 2
    assert (st["engine_deaths"], st["engine_restarts"], st["nodes_lost"], st["engines_moved"]) == (2, 2, 1, 2)
    assert "restart 1/3 failed" not in facts["log"] and "never ran" not in facts["log"]


def test_the_loss_is_named_in_the_rollout_it_happened_in(preemption):
    facts = preemption
    nodes = facts["nodes"]
    events = [r["fleet"] for r in facts["records"]]
    assert [e.get("nodes_lost", 0) for e in events] == [0, 1, 0]
    assert [(e.get("engine_deaths", 0), e.get("engine_restarts", 0)) for e in events] == [(0, 0), (2, 2), (0, 0)]
    short = {k: v[:8] for k, v in nodes.items()}
    assert events[LOST_IN]["lost_nodes"] == [
        f"node {short['engines']}: engine 0 -> node {short['spare']}, engine 1 -> node {short['spare']}"
    ]
    # both engines out of service as soon as the fleet knew, and the loss worded once per engine
    log = facts["log"]
    assert log.count(f"its node {nodes['engines']} was lost") == 2
    assert "its replacement failed" not in log


# ---- the scenario, in its own process ----------------------------------------------------------------
def _hold_requests(urls: list[str]) -> int:
    """Pause the engines, so the rollout's requests wait on them; return once some are waiting."""
    for url in urls:
        requests.post(f"{url}/pause_generation", json={}, timeout=10).raise_for_status()
    deadline = time.monotonic() + WAIT_S
    while not (held := sum(requests.get(f"{u}/get_load", timeout=10).json().get("num_reqs", 0) for u in urls)):
        assert time.monotonic() < deadline, "no request reached the paused engines"
        time.sleep(0.05)  # the engines expose no event for this
    return held


def _wait_for_file(path: Path, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():  # written by the manager's process: no event crosses to this one
        assert time.monotonic() < deadline, f"{what} (waited {WAIT_S:.0f}s)"
        time.sleep(0.05)
    return json.loads(path.read_text())


def _manager_class(work: Path) -> Any:
    """The real RolloutManager, which, for the test only, holds rollout LOST_IN's requests on its engines
    (then says so in `work/held.json`, for the driver to kill their node), records each rollout's batch and
    writes its status at the end (`work/status.json`)."""
    from slime.ray.rollout_manager import RolloutManager

    class WatchedManager(RolloutManager):
        def generate(self, rollout_id: int):
            if rollout_id == LOST_IN:
                urls, nodes = list(self.fleet.endpoints.engine_urls), [s.node_id for s in self.fleet.slots]

                def hold() -> None:
                    held = _hold_requests(urls)
                    (work / "held.json").write_text(json.dumps({"held": held, "engine_nodes": nodes}))

                threading.Thread(target=hold, daemon=True).start()
            out = super().generate(rollout_id)
            import ray

            batch, summary = ray.get(out[0].inner), self.controller.last_summary
            with open(work / "batches.jsonl", "a") as f:
                f.write(
                    json.dumps(
                        {
                            "rollout_id": rollout_id,
                            "samples": len(batch["tokens"]),
                            "sample_indices": list(batch["sample_indices"]),
                            "failed": summary["failed"],
                            "engine_retries": summary["engine_retries"],
                            "weight_versions": sorted({v for vs in batch["weight_versions"] for v in vs}),
                        }
                    )
                    + "\n"
                )
            return out

        def dispose(self) -> None:
            (work / "status.json").write_text(json.dumps(self.status(), default=str))
            super().dispose()

    return WatchedManager


def scenario(model_dir: str, work: Path) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    from slime.cli.train import parse_train_args
    from slime.ray.session import ray_init
    from slime.train.loop import train
    from slime.utils.misc import find_free_port

    warm = contextlib.ExitStack()
    node_args = {"include_dashboard": False, "object_store_memory": 80 * 2**20}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**node_args, "num_cpus": 0, "gcs_server_port": find_free_port(), "_system_config": NODE_DEATH},
    )
    facts: dict[str, Any] = {"seconds": {}, "records": []}
    t0 = time.monotonic()

    def lap(what: str) -> None:  # where the scenario's time goes (reported by the test run, not asserted)
        facts["seconds"][what] = round(time.monotonic() - t0, 1)

    try:
        engines_node = cluster.add_node(num_cpus=2, **node_args)  # both engines (PACK), nothing else fits
        cluster.add_node(num_cpus=1, **node_args)  # the trainer's worker
        # after the nodes' own starts (a raylet has 30 s to register, a preload competes for the CPU)
        fork_server = warm.enter_context(warm_engines(model_dir, work))
        args = parse_train_args(
            _argv(model_dir, work, cluster.address, router_resource=None)
            + ["--num-rollout", str(NUM_ROLLOUT), "--request-retry-window", "180"]
        )
        session = ray_init(args)
        spare: list[Any] = []

        def on_record(record: Any) -> None:
            facts["records"].append(
                {
                    "rollout_id": record.rollout_id,
                    "steps": len(record.steps),
                    "sample_weight_versions": sorted(set(record.sample_weight_versions)),
                    "fleet": record.fleet,
                }
            )
            lap(f"rollout {record.rollout_id} trained")
            if record.rollout_id == LOST_IN - 1:  # a spare node with room for both engines, then the loss
                spare.append(cluster.add_node(num_cpus=2, **node_args))
                threading.Thread(target=lose_engines_node, daemon=True).start()

        def lose_engines_node() -> None:
            held = _wait_for_file(work / "held.json", f"rollout {LOST_IN}'s requests held on the engines")
            facts["held_at_kill"] = held["held"]
            assert held["engine_nodes"] == [engines_node.node_id] * 2, held
            cluster.remove_node(engines_node, allow_graceful=False)
            lap("engines' node lost")

        train(args, on_record=on_record, manager_cls=_manager_class(work), fork_server=fork_server)
        facts["batches"] = [json.loads(line) for line in (work / "batches.jsonl").read_text().splitlines()]
        facts["status_at_end"] = json.loads((work / "status.json").read_text())
        facts["nodes"] = {"engines": engines_node.node_id, "spare": spare[0].node_id}
        session.stop()
    finally:
        ray.shutdown()
        cluster.shutdown()
        warm.close()
    return facts


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(scenario(sys.argv[1], Path(sys.argv[2]))), flush=True)
