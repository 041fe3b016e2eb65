"""The router on a node of its own (`--router-resource NAME`), moved when that node is lost.

`RouterHost` is a Ray actor owning the supervised router process on the node it was placed on (one
offering the Ray resource NAME); it listens on that node's IP, or on 127.0.0.1 when it shares the
manager's node. `RelocatingRouter` is the fleet's handle on it, with `Router`'s calls. A watcher
blocks on the host (an event: the call returns only when the host stops or dies); when the host's
node is lost, a new host is started on another live node offering NAME, else on the manager's node
(which the run needs anyway), every worker is registered with it again, and `on_move` publishes the
new address. Requests in flight on the old router are cut then (the fleet tells slime.utils.router_loss:
a dead host resets no connection, they would wait for --request-timeout) and retried against the new
address within --request-retry-window, with fresh rids (slime.rollout.engine_client).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Callable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from slime.fleet.placement import PLACEMENT_TIMEOUT_S, PlacementError
from slime.fleet.router import Router

logger = logging.getLogger(__name__)

ROUTER_SHARE = 0.01  # of the resource a router takes: several runs may share a router node
_RELOCATE_ATTEMPTS = 3  # a new host may land on a node that dies too


class RouterHost:
    """A Ray actor: the router process on this node. `start()` runs in the actor's default group,
    whose thread lives as long as the actor, so the router dies with it (PR_SET_PDEATHSIG)."""

    def __init__(self, home_node: str, router_kw: dict[str, Any]):
        self.node_id = ray.get_runtime_context().get_node_id()
        host = "127.0.0.1" if self.node_id == home_node else ray.util.get_node_ip_address()
        self.router = Router(host=host, **router_kw)
        self._stopped = threading.Event()

    def start(self) -> tuple[str, str]:
        """(url, node id) once the router answers."""
        self.router.start()
        return self.router.url, self.node_id

    def add_worker(self, url: str, timeout: float) -> None:
        self.router.add_worker(url, timeout)

    def remove_worker(self, url: str) -> None:
        self.router.remove_worker(url)

    def pid(self) -> int | None:
        return self.router.pid

    def restarts(self) -> int:
        return self.router.restarts

    def alive(self) -> bool:
        return self.router.alive()

    def stop(self) -> None:
        try:
            self.router.stop()
        finally:
            self._stopped.set()

    @ray.method(concurrency_group="watch")
    def wait_stopped(self) -> None:
        """Return when `stop()` ran; raises in the caller when this actor or its node dies."""
        self._stopped.wait()


_RouterHostRemote = ray.remote(concurrency_groups={"watch": 1})(RouterHost)


class RelocatingRouter:
    """`Router`'s calls, served by a `RouterHost` on a node offering `resource`; moved when its node is lost.
    `on_move(old_node, new_node, url)` is called after a move, once every worker is registered again."""

    def __init__(
        self, resource: str, home_node: str, router_kw: dict[str, Any], on_move: Callable[[str | None, str, str], None]
    ):
        self.resource, self.home_node, self.router_kw, self.on_move = resource, home_node, dict(router_kw), on_move
        self.workers: list[str] = []
        self.moves = 0
        self.url: str | None = None
        self.node_id: str | None = None
        self._actor: Any = None
        self._lock = threading.RLock()
        self._stopping = threading.Event()

    # ---- start and move ----
    def start(self) -> "RelocatingRouter":
        if not _nodes_offering(self.resource):
            raise PlacementError(
                f"--router-resource {self.resource}: no live node of the cluster offers the Ray "
                f"resource {self.resource!r} (start one with ray start --resources "
                f"'{{\"{self.resource}\": 1}}')"
            )
        self._actor, self.url, self.node_id = self._launch(None)
        threading.Thread(target=self._watch, name="router-host-watch", daemon=True).start()
        return self

    def _launch(self, node: str | None) -> tuple[Any, str, str]:
        """A started host: on a node offering the resource (on `node` when given), else on the manager's."""
        if node == self.home_node and not _nodes_offering(self.resource) & {node}:
            opts: dict[str, Any] = {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}
        else:
            opts = {"resources": {self.resource: ROUTER_SHARE}}
            if node is not None:
                opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        actor = _RouterHostRemote.options(num_cpus=0, **opts).remote(self.home_node, self.router_kw)
        try:
            url, where = ray.get(actor.start.remote(), timeout=PLACEMENT_TIMEOUT_S)
        except BaseException:
            ray.kill(actor)
            raise
        return actor, url, where

    def _watch(self) -> None:
        while not self._stopping.is_set():
            actor = self._actor
            try:
                ray.get(actor.wait_stopped.remote())
                return
            except Exception as e:  # noqa: BLE001 - the host or its node died: the router goes with it
                why = f"{type(e).__name__}"
            if self._stopping.is_set():
                return
            logger.warning(
                "the router's host on node %s is gone (%s); starting the router elsewhere", self.node_id, why
            )
            if not self._relocate():
                return

    def _relocate(self) -> bool:
        """A new host on another node, its workers registered again; False when every attempt failed."""
        old = self.node_id
        for attempt in range(1, _RELOCATE_ATTEMPTS + 1):
            others = sorted(_nodes_offering(self.resource) - {old})
            target = others[0] if others else self.home_node
            try:
                actor, url, node = self._launch(target)
                break
            except Exception as e:  # noqa: BLE001 - that node may be dying too: try again within the budget
                logger.warning(
                    "router restart on node %s failed (attempt %d/%d): %s",
                    target,
                    attempt,
                    _RELOCATE_ATTEMPTS,
                    str(e)[:500],
                )
        else:
            logger.error("the router could not be started on another node; requests fail after --request-retry-window")
            return False
        with self._lock:
            self._actor, self.url, self.node_id = actor, url, node
            self.moves += 1
            for w in list(self.workers):
                try:
                    ray.get(actor.add_worker.remote(w, 60.0), timeout=120)
                except Exception as e:  # noqa: BLE001 - a worker dying meanwhile: its fleet watcher removes it
                    logger.warning("router moved: worker %s not registered again: %s", w, str(e)[:300])
        logger.warning(
            "router moved from node %s to node %s: serving at %s with %d worker(s)", old, node, url, len(self.workers)
        )
        self.on_move(old, node, url)
        return True

    # ---- Router's calls ----
    @property
    def pid(self) -> int | None:
        try:
            return ray.get(self._actor.pid.remote(), timeout=5)
        except Exception:  # noqa: BLE001 - its host is gone (being moved): no process to name
            return None

    @property
    def restarts(self) -> int:
        """Restarts of the router process on its node, plus moves to another node."""
        try:
            return self.moves + ray.get(self._actor.restarts.remote(), timeout=5)
        except Exception:  # noqa: BLE001 - its host is gone: the moves are what is known
            return self.moves

    def add_worker(self, url: str, timeout: float = 60.0) -> None:
        """Registered and healthy on return; if the host died meanwhile, its move registers the worker
        (it is in `workers` before the host is asked: a move takes every worker listed then)."""
        with self._lock:
            if url not in self.workers:
                self.workers.append(url)
            actor = self._actor
        try:
            ray.get(actor.add_worker.remote(url, timeout), timeout=timeout + 60)
        except ray.exceptions.RayActorError:
            logger.warning("router host gone while registering %s: the router's move registers it", url)

    def remove_worker(self, url: str) -> None:
        with self._lock:
            if url in self.workers:
                self.workers.remove(url)
            actor = self._actor
        try:
            ray.get(actor.remove_worker.remote(url), timeout=60)
        except ray.exceptions.RayActorError:
            pass  # the host died: the router's move registers only the workers still listed

    def alive(self) -> bool:
        try:
            return bool(ray.get(self._actor.alive.remote(), timeout=5))
        except Exception:  # noqa: BLE001 - its host is gone
            return False

    def stop(self) -> None:
        self._stopping.set()
        actor = self._actor
        if actor is None:
            return
        try:
            ray.get(actor.stop.remote(), timeout=30)
        finally:
            with contextlib.suppress(Exception):  # already gone with its node
                ray.kill(actor)


def _nodes_offering(resource: str) -> set[str]:
    """Ids of the live nodes that offer `resource`."""
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive") and float(n["Resources"].get(resource, 0)) > 0}
