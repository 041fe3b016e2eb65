"""The fleet's engine actor: an `EngineActor` that can be waited on, for its process's exit and for a
completed weight push, each in a concurrency group of its own."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import ray

from slime.fleet.engine_actor import EngineActor


class SupervisedEngineActor(EngineActor):
    """An `EngineActor` that can be waited on. `wait_exit` runs in its own concurrency group, so it
    blocks there while every other call of the actor goes on as before."""

    @ray.method(concurrency_group="watch")
    def wait_exit(self) -> int | None:
        """Block until the server process exits; its exit code."""
        return self.server.process.wait()

    @ray.method(concurrency_group="pushes")
    def wait_push(self, seen: int, timeout: float) -> tuple[int, str | None]:
        """`pushes_after`, in its own group so it waits while the push itself runs in the default one."""
        return self.pushes_after(seen, timeout)


RemoteSupervisedEngine = ray.remote(concurrency_groups={"watch": 1, "pushes": 1})(SupervisedEngineActor)


def exit_notice(actor: Any) -> concurrent.futures.Future:
    """A future done when this supervised engine's server process exits (its exit code) or its actor
    dies (the error): what a weight push watches to notice the death at once (slime.engine.weight_sync).
    Queued behind the fleet's own watcher in the actor's "watch" group: both end with the process."""
    return actor.wait_exit.remote().future()
