"""A replacement engine loads the trainer's last push at once (issue 31): the trainer keeps its pushed tensors
in Ray's object store with their version (`keep_pushed_weights`), a replacement booted with other weights loads
them, reports that version and serves, instead of waiting in `awaiting_weights` for the next push (which comes
only after the rollout it is needed for). Version checked: kept weights of another version than the fleet serves
are not loaded (the replacement waits for the next push as before), nor is a load that leaves the engine
reporting another version. An engine already awaiting weights when a push is kept loads it then. Stand-in engine
actors on the suite's Ray; the real engines on a multi-raylet cluster: tests/test_multinode_preemption.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from tests.fleet_configs import fleet_config

URL = "http://127.0.0.1:9"


class KeptWeightsEngine:
    """Stands for an engine actor booted with the disk weights ("default"): loads kept weights by fetching
    them from the object store; `reports` (when set) is the version it reports after a load, whatever it got."""

    def __init__(self, reports: str | None = None):
        self.version, self.reports, self.loaded = "default", reports, None

    def start(self) -> str:
        return URL

    def get_weight_version(self) -> str:
        return self.version

    def push_count(self) -> int:
        return 0

    def wait_push(self, seen: int, timeout: float) -> tuple[int, str]:
        import threading

        threading.Event().wait(timeout)  # no push comes in these tests
        return 0, self.version

    def wait_exit(self) -> None:
        import threading

        threading.Event().wait()

    def load_kept_weights(self, kept: list[Any], weight_version: str) -> str:
        import ray

        self.loaded = ray.get(kept[0], timeout=60)
        self.version = self.reports or weight_version
        return self.version

    def got(self) -> Any:
        return self.loaded


class RecordingRouter:
    def __init__(self):
        self.workers: list[str] = []

    def add_worker(self, url: str) -> None:
        self.workers.append(url)


def _engine(ray: Any, reports: str | None = None) -> Any:
    methods = {
        "wait_push": ray.method(concurrency_group="pushes")(KeptWeightsEngine.wait_push),
        "wait_exit": ray.method(concurrency_group="watch")(KeptWeightsEngine.wait_exit),
    }
    cls = type("SupervisedKeptWeightsEngine", (KeptWeightsEngine,), methods)
    return ray.remote(concurrency_groups={"watch": 1, "pushes": 1})(cls).options(num_cpus=0).remote(reports)


@pytest.fixture
def fleet_without_engines(ray_cluster):
    """`make(reports)`: a fleet whose only engine (every one of a lost node's) is a replacement booted with
    the disk weights, not yet brought up; the trainer last pushed version "3"."""
    ray = ray_cluster
    from slime.fleet.fleet import EngineSlot, Fleet

    made: list[Any] = []

    def make(reports: str | None = None) -> tuple[Any, Any]:
        fleet = Fleet(fleet_config())  # --engine-startup-timeout's default: a deadline for a hang
        fleet.router = RecordingRouter()
        replacement = _engine(ray, reports)
        fleet.slots = [EngineSlot(0, [replacement], [0], state="restarting", restarts=1)]
        fleet.note_weight_version("3")
        made.append((fleet, replacement))
        return fleet, replacement

    yield make
    for fleet, replacement in made:
        fleet.stopping.set()
        ray.kill(replacement)


WEIGHTS = [("layer.weight", torch.arange(6, dtype=torch.float32).reshape(2, 3)), ("layer.bias", torch.ones(2))]


def _same(got: Any) -> bool:
    return [n for n, _ in got] == [n for n, _ in WEIGHTS] and all(
        torch.equal(a, b) for (_, a), (_, b) in zip(got, WEIGHTS)
    )


def test_a_replacement_loads_the_kept_push_and_serves_at_once(fleet_without_engines, caplog):
    import ray

    fleet, replacement = fleet_without_engines()
    fleet.weight_gate.keep("3", ray.put(WEIGHTS), fleet.slots)
    with caplog.at_level(logging.WARNING, logger="slime.fleet"):
        fleet.supervisor.bring_up(fleet.slots[0], replacement)
    assert fleet.slots[0].state == "healthy" and fleet.router.workers == [URL]
    assert fleet.endpoints.engine_urls == [URL]
    assert _same(ray.get(replacement.got.remote()))
    said = [r.getMessage() for r in caplog.records]
    assert any(
        m.startswith("engine 0: loaded weight version 3 from the trainer's last push (kept in Ray's object store)")
        for m in said
    ), said
    assert fleet.counters["engine_weights_caught_up"] == 1


def test_kept_weights_of_another_version_are_not_loaded_the_next_kept_push_is(fleet_without_engines):
    import ray

    fleet, replacement = fleet_without_engines()
    fleet.weight_gate.kept = ("2", ray.put(WEIGHTS))  # kept "2" while the fleet serves "3"
    fleet.supervisor.bring_up(fleet.slots[0], replacement)
    assert fleet.slots[0].state == "awaiting_weights" and fleet.router.workers == []
    assert ray.get(replacement.got.remote()) is None  # not loaded
    admitted = fleet.weight_gate.keep("4", ray.put(WEIGHTS), fleet.slots)  # a push it missed completed
    assert admitted == [0] and fleet.slots[0].state == "healthy" and fleet.router.workers == [URL]
    assert fleet.weight_version == "4" and ray.get(replacement.get_weight_version.remote()) == "4"
    assert _same(ray.get(replacement.got.remote()))


def test_a_load_that_leaves_another_version_keeps_it_out_of_the_router(fleet_without_engines, caplog):
    import ray

    fleet, replacement = fleet_without_engines(reports="default")
    fleet.weight_gate.keep("3", ray.put(WEIGHTS), fleet.slots)
    with caplog.at_level(logging.WARNING, logger="slime.fleet"):
        fleet.supervisor.bring_up(fleet.slots[0], replacement)
    assert ray.get(replacement.got.remote()) is not None  # loaded, but it reports another version
    assert fleet.slots[0].state == "awaiting_weights" and fleet.router.workers == []
    assert fleet.endpoints.engine_urls == []
    said = [r.getMessage() for r in caplog.records]
    assert any(
        "engine 0: loaded the trainer's last push of version 3 but reports version default" in m for m in said
    ), said
