"""A worker node (its raylet, and with it an engine) lost DURING a distributed weight push, on a real
multi-raylet Ray cluster (issue 24; the cluster is built as in tests/test_multinode.py): the push goes on
to the engine of the surviving node, the trainer's group is formed again without the lost one, the lost
engine is replaced on a surviving node and gets the weights at the next push (`awaiting_weights`), and the
next rollout is whole, from the pushed weights.

The lost node's engine is frozen (SIGSTOP, its server and its actor's worker) before its raylet is killed: a
machine that loses power or its network closes no connection, so nothing but Ray marking the node dead tells
the push (on one machine a killed process resets its sockets, which told the push at once and hid that a
survivor's destroy queued behind its update until the group's 30 s deadline: issue 31). The push records how
each loss was known and how the survivor left the dropped group (`engine_losses`); the test checks that record,
not the clock.

Engines: one per node (two 1-CPU nodes); the trainer on a third node with room for a moved engine. The
scenario runs in a process of its own (`python -m tests.test_multinode_push MODEL_DIR WORK_DIR`, one JSON
line of facts), as a Ray driver joins one cluster only; the assertions are here. Every step is bounded
(WAIT_S) and a failing one names what it waited for. A push that starts the moment the replacement shows as
updatable is pinned down in tests/test_fleet_awaiting_weights.py; a push that starts before Ray has marked the
node dead still sees the lost engine as healthy (it drops it on the way), so the next push here waits for the
replacement itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.test_multinode import (
    FAST_NODE_DEATH,
    N_PROMPTS,
    N_SAMPLES,
    _actor_node,
    _all_healthy,
    _argv,
    _batch_facts,
    _status_when,
)

ROOT = Path(__file__).resolve().parents[1]
# a killed raylet fails its health checks at once (its port is closed), so it is still noticed within ~2 s;
# a live one on this loaded box gets 10 s per check to answer, not 1 s (3 slow answers must not kill a survivor)
NODE_DEATH = {**FAST_NODE_DEATH, "health_check_timeout_ms": 10_000}
WAIT_S = 300.0  # the bound on each step of the scenario: a failing step fails within it, naming what it waited for


@pytest.mark.slow
def test_node_lost_during_a_push_survivor_pushed_replacement_gets_the_next_push(tiny_model_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.test_multinode_push", str(tiny_model_dir), str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-8000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    a, b, trainer_node = facts["nodes"]["kept"], facts["nodes"]["lost"], facts["nodes"]["trainer"]
    assert [e["node_id"] for e in facts["before"]["engines"]] == [a, b] and a != b  # one engine per node
    assert facts["trainer_nodes"] == [trainer_node]

    # the node went while the push ran (engines paused): the push names the lost engine, or (a race with the
    # tiny model's transfer, seen once in ~6 runs) had already reached it; either way the survivor has it all
    assert facts["paused_at_kill"] == [True, True]
    lost_url = facts["before"]["engines"][1]["url"]
    during = facts["push_during_loss"]
    assert (during["engines_died"], during["engines"]) in (([f"engine at {lost_url}"], 1), ([], 2)), during
    # the loss was known from Ray (the engine actor's exit notice failed: the actor is dead or unreachable), and
    # the survivor's update in the dropped group was released at once, not left to the group's deadline
    print(json.dumps(during))  # shown when an assertion below fails
    for loss in during["engine_losses"]:
        assert loss["engines"] == [f"engine at {lost_url}"], loss
        assert loss["exit"][f"engine at {lost_url}"].startswith(("ActorDiedError", "ActorUnavailableError")), loss
        # the frozen engine never completes a collective: rank 0's wait ended by the notice Ray's marking of the
        # node gave, not by the group's deadline (gloo's "Timed out" after WEIGHT_GROUP_TIMEOUT_S, or rank 0's own
        # "no progress" bound), which would still have named the engine dead from its exit notice afterwards
        assert not _ended_by_deadline(loss["cause"]), loss
        assert list(loss["survivors"]) == [f"engine at {facts['before']['engines'][0]['url']}"], loss
        assert all(map(_released_at_once, loss["survivors"].values())), during
    assert len(during["engine_losses"]) == len(during["engines_died"]), during
    assert facts["survivor_equal_after_loss"] is True

    # replaced on a surviving node, then reached by the next push over a group formed again
    assert facts["next_push"]["engines"] == 2 and facts["next_push"]["engines_died"] == []
    st = facts["after_status"]
    assert [(e["state"], e["node_id"]) for e in st["engines"]] == [("healthy", a), ("healthy", trainer_node)]
    assert st["engines"][1]["moved_from"] == b and st["engines"][1]["url"] != lost_url
    assert [lost["node_id"] for lost in st["lost_nodes"]] == [b]
    assert facts["equal_after_next_push"] == [True, True]

    # nothing lost, nothing twice: rollout 0 trained once before the push, rollout 1 whole from the pushed weights
    assert facts["trained"] == {"rollout_id": 0, "steps": 1}
    n = N_PROMPTS * N_SAMPLES
    got = facts["after"]
    assert got["samples"] == n and len(set(got["sample_indices"])) == n and got["failed"] == 0, got
    assert got["weight_versions"] == ["2"]


def _ended_by_deadline(cause: str) -> bool:
    return "timed out" in cause.lower() or "no progress within" in cause


def _released_at_once(how: str) -> bool:
    """A survivor's call in a dropped group ended by the trainer leaving it (the engine's destroy wakes it, or
    rank 0's abort closes its connections), or was answered; not by the group's deadline (gloo: "Timed out").
    Under load the destroy can reach the survivor before the update does (seen once at load ~15): the update then
    finds no group and is refused at once, having waited for nothing."""
    return (
        how == "answered"
        or "destroyed while this update waited" in how
        or "does not exist; call init_weights_update_group first" in how
        or ("timed out" not in how.lower() and any(w in how for w in ("Connection closed by peer", "Connection reset")))
    )


# ---- the scenario, in its own process ----------------------------------------------------------------
def _paused(urls: list[str]) -> list[bool]:
    return [bool(requests.get(f"{u}/get_load", timeout=10).json().get("paused")) for u in urls]


def _wait_for(pred, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # the engines expose no event for this state
        assert time.monotonic() < deadline, f"{what} (waited {timeout:.0f}s)"
        time.sleep(0.05)


def _engine_processes(manager: Any, url: str) -> list[int]:
    """The pids of the engine serving `url`: its server process and its actor's worker (the server's parent)."""
    engines = _got(manager.get_updatable_engines_and_lock.remote(), "get_updatable_engines_and_lock")[0]
    [engine] = [e for e in engines if _got(e.url.remote(), "engine url") == url]
    server = _got(engine.pid.remote(), "engine pid")
    worker = int(Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return [server, worker]


def _got(ref: Any, what: str) -> Any:
    """`ray.get` bounded by WAIT_S, naming the call that did not answer."""
    import ray

    try:
        return ray.get(ref, timeout=WAIT_S)
    except ray.exceptions.GetTimeoutError:
        raise AssertionError(f"{what}: no answer within {WAIT_S:.0f}s") from None


def scenario(model_dir: str, work: Path) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    from slime.cli.args import parse_args
    from slime.ray.session import ray_init, start_manager, stop_manager
    from slime.train.actor_group import TrainGroup
    from slime.train.flags import WorkerConfig
    from slime.utils.misc import find_free_port

    node_args = {"include_dashboard": False, "object_store_memory": 80 * 2**20}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**node_args, "num_cpus": 0, "gcs_server_port": find_free_port(), "_system_config": NODE_DEATH},
    )
    facts: dict[str, Any] = {}
    try:
        engine_nodes = [cluster.add_node(num_cpus=1, **node_args) for _ in range(2)]  # one engine each
        # the router stays on the manager's node (the node lost here takes an engine only)
        args = parse_args(
            _argv(model_dir, work, cluster.address, router_resource=None)
            + ["--update-weight-buffer-size", str(64 << 10)]
        )
        session = ray_init(args)
        manager, info = start_manager(args)
        trainer_node = cluster.add_node(num_cpus=3, **node_args)  # the trainer's, with room for a moved engine
        facts["before"] = _got(manager.status.remote(), "status")
        lost = next(n for n in engine_nodes if n.node_id == facts["before"]["engines"][1]["node_id"])
        kept = next(n for n in engine_nodes if n is not lost)
        facts["nodes"] = {"kept": kept.node_id, "lost": lost.node_id, "trainer": trainer_node.node_id}
        trainer = TrainGroup(WorkerConfig.from_args(args), args)
        trainer.start()
        facts["trainer_nodes"] = [_actor_node(w) for w in trainer.workers]
        _got(manager.set_train_parallel_config.remote({"dp_size": 1}), "set_train_parallel_config")
        trainer.update_weights(manager, "0", "distributed")  # the group is formed: the next push goes to buckets
        metrics = trainer.train(0, _got(manager.generate.remote(0), "rollout 0"))
        facts["trained"] = {"rollout_id": metrics["rollout_id"], "steps": len(metrics["steps"])}

        urls = info["engine_urls"]
        frozen = _engine_processes(manager, urls[1])
        pool = ThreadPoolExecutor(1, thread_name_prefix="push")
        try:
            push = pool.submit(trainer.update_weights, manager, "1", "distributed")
            _wait_for(lambda: all(_paused(urls)) or push.done(), "the push never paused the engines")
            facts["paused_at_kill"] = _paused(urls)
            for pid in frozen:  # the machine stops answering: no connection of its is closed
                os.kill(pid, signal.SIGSTOP)
            cluster.remove_node(lost, allow_graceful=False)
            facts["push_during_loss"] = push.result(timeout=WAIT_S)
        finally:
            pool.shutdown(wait=False)  # a push past its bound is not waited for: the scenario fails naming it
            for pid in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        trained = trainer.weight_checksums()
        facts["survivor_equal_after_loss"] = requests.post(
            f"{urls[0]}/weights_checker", timeout=60, json={"action": "compare", "checksums": trained}
        ).json()["equal"]

        # replaced: placed on another node, up, waiting for weights. Not just "healthy": a push that finished
        # before Ray marked the node dead leaves the lost engine shown healthy until then, and a push started
        # in that window goes to the dead engine (which it drops) instead of the replacement
        _status_when(
            manager,
            lambda st: (
                st["engines"][1]["moved_from"] == lost.node_id
                and st["engines"][1]["state"] in ("awaiting_weights", "healthy")
            ),
            "the lost engine replaced",
            WAIT_S,
        )
        facts["next_push"] = trainer.update_weights(manager, "2", "distributed")
        facts["after_status"] = _status_when(manager, _all_healthy, "the replacement admitted by the next push", WAIT_S)
        facts["equal_after_next_push"] = [
            c["equal"]
            for c in _got(manager.check_weights.remote("compare", trainer.weight_checksums()), "check_weights")
        ]
        [box] = _got(manager.generate.remote(1), "rollout 1")
        facts["after"] = _batch_facts(
            _got(box.inner, "rollout 1's batch"), _got(manager.last_summary.remote(), "last_summary")
        )

        trainer.shutdown()
        stop_manager(manager)
        session.stop()
    finally:
        ray.shutdown()
        cluster.shutdown()
    return facts


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(scenario(sys.argv[1], Path(sys.argv[2]))), flush=True)
