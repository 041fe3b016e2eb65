"""A replacement engine that boots with other weights than the serving engines waits in `awaiting_weights`
and is admitted by the trainer's next push, however that push is timed: also when it starts the moment the
replacement shows as updatable (a trainer reads engine states without the fleet's lock; issue 24's node lost
during a push, where the replacement never served), and when a wait for the push fails without the engine's
death (a late answer on a loaded host). Stand-in engine actors; the real engines: tests/test_push_faults.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from tests.fleet_configs import fleet_config

URL = "http://127.0.0.1:9"


class PushCountingEngine:
    """Stands for an engine actor: reports a weight version, counts the pushes completed on it, and fails
    its first `failing_waits` waits for a push (an error, not a death)."""

    def __init__(self, version: str, failing_waits: int = 0):
        self.version, self.failing_waits = version, failing_waits
        self.count = 0
        self.pushes = threading.Condition()

    def start(self) -> str:
        return URL

    def get_weight_version(self) -> str:
        return self.version

    def push_count(self) -> int:
        with self.pushes:
            return self.count

    def push(self, version: str) -> None:
        """A whole push (pause, buckets, continue) completed: what the trainer's push does."""
        with self.pushes:
            self.count, self.version = self.count + 1, version
            self.pushes.notify_all()

    def wait_exit(self) -> None:
        """Like the real actor's: returns only when the engine is gone (here: raises, its actor killed)."""
        threading.Event().wait()

    def wait_push(self, seen: int, timeout: float) -> tuple[int, str]:
        if self.failing_waits:
            self.failing_waits -= 1
            raise RuntimeError("the answer came too late")
        with self.pushes:
            self.pushes.wait_for(lambda: self.count > seen, timeout=timeout)
            return self.count, self.version


class RecordingRouter:
    """The fleet's router: `admitted` is set when an engine is registered (the fleet admits it)."""

    def __init__(self):
        self.workers: list[str] = []
        self.admitted = threading.Event()

    def add_worker(self, url: str) -> None:
        self.workers.append(url)
        self.admitted.set()


def _engine(ray: Any, version: str, failing_waits: int = 0) -> Any:
    # the real actor's groups (slime.fleet.supervised_engine.SupervisedEngineActor): the waits never block its other calls
    methods = {
        "wait_push": ray.method(concurrency_group="pushes")(PushCountingEngine.wait_push),
        "wait_exit": ray.method(concurrency_group="watch")(PushCountingEngine.wait_exit),
    }
    cls = type("SupervisedPushCountingEngine", (PushCountingEngine,), methods)
    remote = ray.remote(concurrency_groups={"watch": 1, "pushes": 1})(cls)
    return remote.options(num_cpus=0).remote(version, failing_waits)


@pytest.fixture(scope="module")
def serving_engine(ray_cluster):
    """An engine serving weight version "1" (only asked for its version: shared by the tests)."""
    actor = _engine(ray_cluster, "1")
    yield actor
    ray_cluster.kill(actor)


@pytest.fixture
def fleet_with_a_replacement(ray_cluster, serving_engine):
    """`make(slot_class, failing_waits)`: a fleet whose engine 0 serves version "1" and whose engine 1 is a
    replacement booted with the disk weights ("default"), not yet brought up."""
    ray = ray_cluster
    from slime.fleet.fleet import EngineSlot, Fleet

    made: list[Any] = []

    def make(slot_class: type = EngineSlot, failing_waits: int = 0) -> tuple[Any, Any]:
        fleet = Fleet(fleet_config("--engine-startup-timeout", "30"))
        fleet.router = RecordingRouter()
        replacement = _engine(ray, "default", failing_waits)
        fleet.slots = [
            EngineSlot(0, [serving_engine], [0], url="http://127.0.0.1:8", state="healthy"),
            slot_class(1, [replacement], [1], state="restarting", restarts=1),
        ]
        made.append((fleet, replacement))
        return fleet, replacement

    yield make
    for fleet, replacement in made:
        fleet.stopping.set()
        ray.kill(replacement)


def test_a_push_that_starts_the_moment_the_replacement_is_updatable_admits_it(fleet_with_a_replacement):
    import ray

    from slime.fleet.fleet import EngineSlot

    class PushedWhenUpdatable(EngineSlot):
        """A trainer that pushes as soon as it sees the engine updatable, before the fleet goes on."""

        def __setattr__(self, name: str, value: Any) -> None:
            super().__setattr__(name, value)
            if name == "state" and value == "awaiting_weights":
                ray.get(self.actors[0].push.remote("2"), timeout=60)

    fleet, replacement = fleet_with_a_replacement(PushedWhenUpdatable)
    fleet.supervisor.bring_up(fleet.slots[1], replacement)
    assert fleet.router.admitted.wait(60), "the pushed replacement was never admitted"
    assert fleet.router.workers == [URL] and fleet.slots[1].state == "healthy"
    assert fleet.endpoints.engine_urls == ["http://127.0.0.1:8", URL]
    assert fleet.weight_version == "2"  # what the push left on it


def test_a_failed_wait_for_the_push_is_asked_again_and_the_push_admits_it(fleet_with_a_replacement):
    import ray

    fleet, replacement = fleet_with_a_replacement(failing_waits=2)
    fleet.supervisor.bring_up(fleet.slots[1], replacement)
    assert fleet.slots[1].state == "awaiting_weights" and fleet.router.workers == []
    ray.get(replacement.push.remote("2"), timeout=60)
    assert fleet.router.admitted.wait(60), "the replacement was not admitted after two failed waits"
    assert fleet.slots[1].state == "healthy" and fleet.endpoints.engine_urls == ["http://127.0.0.1:8", URL]


def test_an_engine_whose_waits_keep_failing_is_killed_for_its_watcher_to_replace(
    fleet_with_a_replacement, monkeypatch, caplog
):
    import logging

    import ray

    from slime.fleet import awaiting_weights

    monkeypatch.setattr(awaiting_weights, "_PUSH_WAIT_RETRIES", 2)
    fleet, replacement = fleet_with_a_replacement(failing_waits=10)
    with caplog.at_level(logging.WARNING, logger="slime.fleet"):
        fleet.supervisor.bring_up(fleet.slots[1], replacement)
        with pytest.raises(ray.exceptions.RayActorError):  # killed: its watcher sees the death
            ray.get(replacement.wait_exit.remote(), timeout=60)
    assert fleet.slots[1].state == "awaiting_weights" and fleet.router.workers == []  # never admitted
    said = [r.getMessage() for r in caplog.records]
    assert any(
        "engine 1 awaiting weights: waiting for its push failed (RayTaskError" in m and "(1/2)" in m for m in said
    ), said
    assert any(
        "engine 1 awaiting weights: 2 waits for its push failed" in m and m.endswith("replacing it") for m in said
    ), said
