"""A runtime's fully-async workers and what they share: the current weight version, and whether a
weight update is under way (`pause` / `resume` from the trainer; nested pauses resume when the last
one ends). The controller reaches it through `worker_hub(runtime)` to pause, resume, stop and
checkpoint the workers (`fully_async_rollout.AsyncRolloutWorker`).
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, TypeVar

from slime.rollout.runtime import RolloutRuntime
from slime.rollout.weight_versions import version_number
from slime.utils.async_utils import run
from slime.utils.types import Sample


class Worker(Protocol):
    """What the hub asks of a worker (`AsyncRolloutWorker`)."""

    async def pause(self) -> None: ...

    async def resume(self) -> None: ...

    async def close(self) -> dict[str, int]: ...

    def held_groups(self) -> list[list[Sample]]: ...


W = TypeVar("W", bound=Worker)


class WorkerHub:
    """A runtime's fully-async workers and what they share: the current weight version and whether
    a weight update is under way (nested pauses resume when the last one ends)."""

    def __init__(self) -> None:
        self.workers: list[Worker] = []
        self.version: int | None = None
        self._pauses = 0

    @property
    def paused(self) -> bool:
        return self._pauses > 0

    def observe(self, version: int | None) -> None:
        if version is not None and (self.version is None or version > self.version):
            self.version = version

    def add(self, worker: W) -> W:
        self.workers.append(worker)
        return worker

    async def pause(self) -> None:
        self._pauses += 1
        if self._pauses == 1:
            await asyncio.gather(*(w.pause() for w in self.workers))

    async def resume(self, weight_version: Any = None) -> None:
        self.observe(version_number(weight_version))
        self._pauses = max(0, self._pauses - 1)
        if self._pauses == 0:
            for w in self.workers:
                await w.resume()

    def held_groups(self) -> list[list[Sample]]:
        """Fresh copies of every group the workers hold (generating, suspended, finished and not yet
        taken): what a checkpoint saves as if back in the buffer, so a resumed run loses none."""
        return [g for w in self.workers for g in w.held_groups()]

    async def stop(self) -> dict[str, int]:
        returned = 0
        for w in self.workers:
            returned += (await w.close())["returned_groups"]
        self.workers = []
        return {"returned_groups": returned}


def worker_hub(runtime: RolloutRuntime) -> WorkerHub:
    """The runtime's hub (created on first use; its workers stop when the runtime closes, before
    the client's sessions close under them)."""

    def build() -> WorkerHub:
        hub = WorkerHub()
        runtime.on_close(lambda: run(hub.stop()))
        return hub

    return runtime.shared("fully_async_rollout.hub", build)
