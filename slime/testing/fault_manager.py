"""`FaultInjectingManager`: the `RolloutManager` with the fault hooks tests and chaos runs call.

The production manager has no way to kill its own engines; a test that needs one starts this subclass
instead (`start_manager(args, FaultInjectingManager)`, `manager_and_trainer`, or `ray.remote(...)`),
and the faults go through the fleet as they would in a real loss.
"""

from __future__ import annotations

from slime.ray.rollout_manager import RolloutManager


class FaultInjectingManager(RolloutManager):
    def kill_engine(self, index: int) -> int | None:
        """SIGKILL engine `index`'s server; its pid (the fleet notices the death and replaces it)."""
        return self.fleet.kill_engine(index)

    def kill_engine_during_push(self, index: int, at_update: int) -> None:
        """SIGKILL engine `index`'s server at the `at_update`-th bucket of the next weight push."""
        self.fleet.kill_engine_during_push(index, at_update)

    def router_pid(self) -> int | None:
        return self.fleet.router.pid if self.fleet and self.fleet.router else None

    def router_alive(self) -> bool:
        return bool(self.fleet and self.fleet.router and self.fleet.router.alive())
