"""`EngineSupervisor`: each engine watched, and a dead one replaced.

Engines are supervised like the router. A watcher thread per engine blocks on a call that only
returns when the engine's server process exits (or its actor dies): an event, not a poll. A dead
engine is reported at once (a warning and the `engine_deaths` counter), taken out of the router
and of the shared `Endpoints` (so requests stop going there), Ray is asked whether its node was lost
(until Ray decides: a replacement is never created on a bundle Ray still maps to a dead node, so a node
loss costs one restart per engine), and it is replaced: its actor is killed
and a new one created on the same placement-group bundle, started, given the latest weights the
fleet was told to load, and registered. `--engine-max-restarts` bounds the restarts per engine;
after that the engine is `failed` and the pool runs without it. Where the replacement lands after a
node loss: slime.fleet.lost_nodes and slime.fleet.room; which weights it must have before it serves:
slime.fleet.awaiting_weights."""

from __future__ import annotations

import logging
import threading
from typing import Any

import ray

from slime.fleet.engine_slot import UPDATABLE_STATES, EngineSlot, serving
from slime.fleet.lost_nodes import NODE_DECISION_S, node_alive, node_lost
from slime.fleet.room import NoRoomError, RoomWait, place

logger = logging.getLogger(__name__)


class EngineSupervisor:
    """Watches the engines of `fleet` (the `Fleet` that owns it: its slots, lock, stop event, counters,
    router registration, lost nodes and weight gate) and brings a new one up for each that dies."""

    def __init__(self, fleet: Any):
        self.fleet = fleet
        self.max_restarts = int(fleet.config.flags.engine_max_restarts)
        self.room = RoomWait(fleet.counters, fleet.stopping, fleet.lost_nodes, resume=self._resume, died=self.on_death)
        self.watchers: list[threading.Thread] = []

    def start(self) -> None:
        """A watcher thread per engine."""
        for slot in self.fleet.slots:
            t = threading.Thread(target=self.watch, args=(slot,), name=f"engine-watch-{slot.rank}", daemon=True)
            t.start()
            self.watchers.append(t)

    def watch(self, slot: EngineSlot) -> None:
        """Block until this engine's server exits; then report it and bring a new one up."""
        while not self.fleet.stopping.is_set():
            actor = slot.actor
            actor_died = False
            try:
                code: Any = ray.get(actor.wait_exit.remote())
            except ray.exceptions.RayActorError as e:
                code, actor_died = f"actor died ({type(e).__name__})", True
            except Exception as e:  # noqa: BLE001 - anything else also means we lost the engine
                code, actor_died = f"{type(e).__name__}: {e}", True
            if self.fleet.stopping.is_set() or slot.actor is not actor:
                return
            self.on_death(slot, code, actor=actor if actor_died else None)
            if slot.state not in UPDATABLE_STATES:
                return

    def on_death(self, slot: EngineSlot, code: Any, actor: Any = None) -> None:
        """Report the death, take the engine out of service at once, ask Ray whether its node was lost
        (`actor`: its dead actor, whose death may be its node's), and restart it while the budget lasts.
        A replacement that failed before it served is re-placed, not reported dead a second time."""
        fleet = self.fleet
        with fleet.lock:
            served = slot.state in UPDATABLE_STATES or slot.node_lost  # taken out with its node: it served
            registered = slot.state == "healthy"
            slot.state, slot.last_exit = "dead", code
            if served:
                slot.deaths += 1
                fleet.counters["engine_deaths"] += 1
            fleet.publish()
        if slot.url and registered:
            fleet.unregister(slot.url)
        lost = self._node_lost(slot, actor)
        if served and any(s.state == "healthy" for s in fleet.slots):
            # remembered, in case every engine is gone later
            fleet.weight_gate.serving_version(fleet.slots, exclude=slot)
        restarting = slot.restarts < self.max_restarts and len(slot.actors) == 1
        where = f"; its node {slot.node_id} was lost" if lost else ""
        if served:
            logger.warning(
                "engine %d at %s died (exit code %s)%s; %s",
                slot.rank,
                slot.url,
                code,
                where,
                "restarting it" if restarting else "not restarting it",
            )
        else:
            logger.warning(
                "engine %d: its replacement failed before it served (%s)%s; %s",
                slot.rank,
                code,
                where,
                "placing it again" if restarting else "not placing it again",
            )
        self._restart(slot)

    def _node_lost(self, slot: EngineSlot, actor: Any) -> bool | None:
        """Ask Ray until it decides whether the engine's node is gone; a lost node is named now (in the
        rollout it happened in), and its other engines are taken out of service at once (their watchers
        report their deaths as Ray gets to them)."""
        fleet = self.fleet
        node = slot.node_id
        if slot.node_lost:  # its node was found lost when another of its engines died
            slot.node_lost = False
            return True
        if node is None:
            return None
        if (
            actor is None
        ):  # its process exited (its actor lives), or a replacement failed: no death of Ray's to ask about
            lost = not node_alive(node) or None
        else:
            lost = node_lost(node, actor, fleet.stopping)
        if lost is None and actor is not None:
            logger.warning(
                "engine %d: Ray did not decide within %.0fs whether its node %s is alive; restarting it on its bundle",
                slot.rank,
                NODE_DECISION_S,
                node,
            )
        if not lost:
            return lost
        fleet.lost_nodes.note(node, slot)
        with fleet.lock:
            others = [s for s in fleet.slots if s is not slot and s.node_id == node and s.state in UPDATABLE_STATES]
            registered = [s.url for s in others if s.state == "healthy" and s.url]
            for s in others:
                s.state, s.node_lost = "dead", True
            if others:
                fleet.publish()
        for s in others:
            fleet.lost_nodes.note(node, s)
        for url in registered:
            fleet.unregister(url)
        return lost

    def _restart(self, slot: EngineSlot) -> None:
        while not self.fleet.stopping.is_set():
            if len(slot.actors) > 1:
                self._fail(slot, "a multi-node engine is not restarted")
                return
            if slot.restarts >= self.max_restarts:
                self._fail(slot, f"restart budget spent (--engine-max-restarts {self.max_restarts})")
                return
            slot.restarts += 1
            self.fleet.counters["engine_restarts"] += 1
            slot.state = "restarting"
            try:
                self._replace(slot)
                return
            except NoRoomError as e:
                self.room.unplaced(slot, str(e), self.fleet.slots)
                return
            except Exception as e:  # noqa: BLE001 - try again while the budget lasts
                slot.last_exit = f"restart failed: {type(e).__name__}"
                logger.warning(
                    "engine %d: restart %d/%d failed: %s", slot.rank, slot.restarts, self.max_restarts, str(e)[:2000]
                )

    def _fail(self, slot: EngineSlot, why: str) -> None:
        slot.state = "failed"
        self.fleet.counters["engine_failed"] += 1
        logger.error(
            "engine %d is gone for the rest of the run: %s; %d engine(s) left",
            slot.rank,
            why,
            serving(self.fleet.slots),
        )

    def _replace(self, slot: EngineSlot) -> None:
        """Kill the dead engine's actor and start a new one on the same bundle."""
        old = slot.actor
        try:
            ray.kill(old)
        except Exception:  # noqa: BLE001 - already gone
            pass
        actor = self.fleet.new_actor(slot.rank, slot.bundles[0])
        slot.actors = [actor]  # from here on, stop() stops the new one
        place(slot, actor, self.fleet.lost_nodes)
        self.bring_up(slot, actor)

    def _resume(self, slot: EngineSlot, actor: Any) -> None:
        """An engine that found room (slime.fleet.room): brought up like any replacement, then watched."""
        slot.state = "restarting"
        try:
            self.bring_up(slot, actor)
        except Exception as e:  # noqa: BLE001 - handled as a death: restarted while the budget lasts
            self.on_death(slot, f"restart failed: {type(e).__name__}: {str(e)[:300]}")
        if slot.state in UPDATABLE_STATES:
            self.watch(slot)

    def bring_up(self, slot: EngineSlot, actor: Any) -> None:
        """Start the placed replacement, give it what the others got, and admit it (or let it await weights)."""
        fleet = self.fleet
        timeout = float(fleet.config.engine.engine_startup_timeout) + 60.0
        url = ray.get(actor.start.remote(), timeout=timeout)
        if fleet.stopping.is_set():
            return
        with fleet.lock:
            for method, call_args in fleet.replayed.items():
                ray.get(getattr(actor, method).remote(*call_args), timeout=600)
            for hook in fleet.replacement_hooks:
                hook(actor)
            slot.url = url
        # a replacement with other weights than the fleet serves loads the trainer's kept push (the version
        # may move while it loads: then again), else awaits the next push out of the router
        while True:
            with fleet.lock:
                stale = fleet.weight_gate.stale(slot, actor, fleet.slots)
                if stale is None:
                    fleet.admit(slot)
                    break
                kept = fleet.weight_gate.kept
                if kept is None or kept[0] != stale[1]:
                    self._hold(slot, actor, stale)
                    return
            # not under the lock: a load takes a while, and no push reaches an engine still restarting
            if not fleet.weight_gate.catch_up(slot, actor):
                with fleet.lock:
                    self._hold(slot, actor, stale)
                return
        logger.warning(
            "engine %d replaced: serving at %s on node %s (restart %d/%d); %d of %d engines serve",
            slot.rank,
            url,
            slot.node_id,
            slot.restarts,
            self.max_restarts,
            serving(fleet.slots),
            len(fleet.slots),
        )

    def _hold(self, slot: EngineSlot, actor: Any, stale: tuple[str | None, str]) -> None:
        """Out of the router until the trainer's next push reaches it (caller holds the lock)."""
        self.fleet.weight_gate.hold(slot, actor)
        logger.warning(
            "engine %d replaced at %s with weight version %s; the others serve %s: it takes requests "
            "after the trainer's next push (restart %d/%d)",
            slot.rank,
            slot.url,
            *stale,
            slot.restarts,
            self.max_restarts,
        )
