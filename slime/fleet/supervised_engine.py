"""The fleet's engine actor: an `EngineActor` that can be waited on, for its process's exit and for a
completed weight push, each in a concurrency group of its own; and whose weight group can be destroyed
while an update waits in one of its collectives (the "control" group)."""

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

    @ray.method(concurrency_group="control")
    def destroy_weights_update_group(self, group_name: str) -> object:
        """Not behind the update it ends: when a member of the group is lost without closing its
        connections (its node powered off or cut off), this engine's update waits in a collective with it
        until the group's deadline, and the trainer's destroy must reach the engine (which wakes that
        update at once) instead of queueing behind it in the default group until then."""
        return super().destroy_weights_update_group(group_name)


# every concurrency group of the fleet's engine actor (one call each at a time besides the default group)
ENGINE_CONCURRENCY_GROUPS = {"watch": 1, "pushes": 1, "control": 1}
RemoteSupervisedEngine = ray.remote(concurrency_groups=ENGINE_CONCURRENCY_GROUPS)(SupervisedEngineActor)


def exit_notice(actor: Any) -> concurrent.futures.Future:
    """A future done when this supervised engine's server process exits (its exit code) or its actor
    dies (the error): what a weight push watches to notice the death at once (slime.weights.push).
    Queued behind the fleet's own watcher in the actor's "watch" group: both end with the process."""
    return actor.wait_exit.remote().future()
