"""`Fleet`: the router and the engine pool, started together, controlled and healed as one.

Start-up is all-or-nothing: if any engine fails to start, everything already started is stopped
and the error carries that engine's log tail. Engines are Ray actors on a placement group, each
owning its server process (slime.fleet.supervised_engine; one `EngineSlot` each); the router is a
supervised child process restarted if it dies (with `--router-resource`, on a node of its own and
moved when that node is lost: slime.fleet.router_host).

The fleet's parts, each owned by it and handed its lock, stop event and counters:
- `EngineSupervisor` (slime.fleet.supervision): a watcher per engine; a dead one is replaced, within
  `--engine-max-restarts`;
- `RoomWait` (slime.fleet.room, the supervisor's): a replacement no node has room for waits, unplaced,
  for a node with room to join;
- `LostNodes` (slime.fleet.lost_nodes): what each lost Ray node took, and where its engines and the
  router went;
- `WeightGate` (slime.fleet.awaiting_weights): a replacement with other weights than the fleet serves
  loads the trainer's last push (kept in Ray's object store), or waits, out of the router, for the next push.

It receives its flags as one `FleetConfig` (slime.fleet.flags), read from the namespace by its owner, and never
sees `args`: where the router serves is handed back through `on_router_url` (the manager writes it onto
`args.sglang_router_ip/port`, slime's contract for plugins).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any, Callable

import ray
from ray.util.placement_group import remove_placement_group

from slime.fleet.awaiting_weights import WeightGate
from slime.fleet.engine_slot import UPDATABLE_STATES, EngineSlot
from slime.fleet.lost_nodes import NODE_COUNTERS, LostNodes
from slime.fleet.placement import bundle_strategy, create_engine_placement_group
from slime.fleet.external_engines import check_reachable, external_urls
from slime.fleet.flags import FleetConfig
from slime.fleet.router import Router, register_worker, unregister_worker
from slime.fleet.router_host import RelocatingRouter
from slime.fleet.supervised_engine import RemoteSupervisedEngine, SupervisedEngineActor, exit_notice
from slime.fleet.supervision import EngineSupervisor
from slime.utils.endpoints import Endpoints
from slime.utils.startup_trace import mark

__all__ = ["NODE_COUNTERS", "UPDATABLE_STATES", "EngineSlot", "Fleet", "SupervisedEngineActor", "exit_notice"]

logger = logging.getLogger(__name__)

# control calls whose effect a replacement engine must get too (replayed before it takes requests)
_REPLAYED = ("update_weights_from_disk",)


class Fleet:
    """Starts the router and the engines, hands control calls to the serving engines, reports their status
    and stops them; its parts (above) keep the pool whole in between."""

    def __init__(
        self,
        config: FleetConfig,
        fork_server: str | None = None,
        on_router_url: Callable[[str], None] | None = None,
    ):
        """`on_router_url(url)`: called wherever the router serves from then on (at start, and when it moved)."""
        self.config = config
        self.on_router_url = on_router_url
        self.router: Router | None = None
        self.pg = None
        self.slots: list[EngineSlot] = []
        self.endpoints = Endpoints()
        self.startup_timings: dict[str, float] = {}
        self.counters: Counter = Counter()  # engine_deaths, engine_restarts, engine_failed, NODE_COUNTERS
        self.stopping = threading.Event()  # set at stop: ends supervision and every wait of its parts
        self.lock = threading.RLock()  # slot replacement vs. control calls (see `each`)
        self.replayed: dict[str, tuple[Any, ...]] = {}  # the last call of each `_REPLAYED` method
        # fn(actor) run on a replacement engine before it takes requests (e.g. push the trainer's weights)
        self.replacement_hooks: list[Any] = []
        self.lost_nodes = LostNodes(self.counters, self.lock)
        self.weight_gate = WeightGate(self.lock, self.stopping, self.counters, admit=self.admit)
        self.supervisor = EngineSupervisor(self)
        # the socket of this node's engine fork server (from the Ray session that started it): embedded
        # engines, replacements included, are forked from it warm; None: they start cold
        self.fork_server = fork_server

    # ---- views kept for callers of the old attributes ----
    @property
    def engines(self) -> list[Any]:
        """Node-0 actor of each engine: the ones that take requests."""
        return [s.actor for s in self.slots]

    @property
    def all_engines(self) -> list[Any]:
        return [a for s in self.slots for a in s.actors]

    @property
    def updatable_engines(self) -> list[Any]:
        """Node-0 actors of the engines a weight push must reach: serving ones and restarted ones awaiting the
        current weights (slime.weights.manager hands them to the trainer)."""
        with self.lock:
            return [s.actor for s in self.slots if s.state in UPDATABLE_STATES]

    @property
    def weight_version(self) -> str | None:
        """The version the serving engines last reported (or the trainer last pushed)."""
        return self.weight_gate.version

    def note_weight_version(self, version: str | None) -> None:
        """The trainer pushed `version` (the manager's `end_weight_update`): slime.fleet.awaiting_weights."""
        self.weight_gate.note(version)

    # ---- start-up ----
    def start(self) -> Endpoints:
        """Engines boot while the router starts; returns when every engine is registered."""
        if external_urls(self.config.rollout_external_engine_addrs):
            return self._start_external()
        t0 = time.monotonic()
        refs = self._launch_engines()
        self._start_router()
        self.startup_timings["router"] = time.monotonic() - t0
        urls = ray.get(refs)  # the first engine failure is raised here
        self.startup_timings["engines"] = time.monotonic() - t0
        mark("fleet: engines serving")
        per = len(urls) // max(1, len(self.slots))
        nodes = ray.get([s.actor.node_id.remote() for s in self.slots])
        for slot, url, node in zip(self.slots, urls[::per], nodes):
            slot.url, slot.node_id = url, node
            self._register(url)
            slot.state = "healthy"
        self.publish()
        # the boot version: what a replacement serves until a push changes it
        self.weight_gate.serving_version(self.slots)
        self.startup_timings["registered"] = time.monotonic() - t0
        self.supervisor.start()
        return self.endpoints

    def _start_external(self) -> Endpoints:
        """--rollout-external-engine-addrs: the given engines behind our router, none of ours (external_engines)."""
        t0 = time.monotonic()
        urls = external_urls(self.config.rollout_external_engine_addrs)
        check_reachable(urls)
        self._start_router()
        for url in urls:
            self._register(url)
        self.endpoints.engine_urls = list(urls)
        self.startup_timings["registered"] = time.monotonic() - t0
        logger.info(
            "serving with %d external engine(s) through %s: %s", len(urls), self.endpoints.router_url, ", ".join(urls)
        )
        return self.endpoints

    def _engine_layout(self) -> tuple[int, int, int]:
        """(engines, nodes per engine, bundles per node of an engine)."""
        config, engine = self.config, self.config.engine
        if engine.rollout_backend != "sglang":
            return config.rollout_num_engines, 1, 1
        per_node = min(engine.num_gpus_per_node, engine.rollout_num_gpus_per_engine)
        nodes = max(1, engine.rollout_num_gpus_per_engine // engine.num_gpus_per_node)
        return config.rollout_num_gpus // per_node // nodes, nodes, per_node

    def new_actor(
        self, rank: int, bundle: int, node_rank: int = 0, nnodes: int = 1, dist_init_addr: str | None = None
    ) -> Any:
        engine = self.config.engine
        if engine.rollout_backend == "sglang":
            return RemoteSupervisedEngine.options(
                num_cpus=0.2, num_gpus=0.2, scheduling_strategy=bundle_strategy(self.pg, bundle)
            ).remote(engine, rank, node_rank, nnodes, dist_init_addr)
        return RemoteSupervisedEngine.options(
            num_cpus=float(self.config.rollout_num_cpus_per_engine),
            scheduling_strategy=bundle_strategy(self.pg, bundle),
        ).remote(engine, rank, fork_server=self.fork_server)

    def _launch_engines(self) -> list[Any]:
        """Create the engine actors on their bundles and start their servers (not awaited)."""
        self.pg = create_engine_placement_group(self.config)
        num_engines, nodes, per_node = self._engine_layout()
        for rank in range(num_engines):
            actors, bundles, dist_init_addr = [], [], None
            for node_rank in range(nodes):
                bundle = (rank * nodes + node_rank) * per_node
                actor = self.new_actor(rank, bundle, node_rank, nodes, dist_init_addr)
                if node_rank == 0 and nodes > 1:
                    # the other nodes of this engine join node 0's torch.distributed rendezvous
                    dist_init_addr = ray.get(actor.rendezvous_address.remote())
                actors.append(actor)
                bundles.append(bundle)
            self.slots.append(EngineSlot(rank, actors, bundles))
        return [a.start.remote() for a in self.all_engines]

    def _start_router(self) -> None:
        router = self.config.router
        if router.sglang_router_ip is not None:
            self.endpoints.router_url = f"http://{router.sglang_router_ip}:{router.sglang_router_port}"
            return
        router_kw = router.router_kw()
        resource = self.config.flags.router_resource
        if resource:  # on a node of its own, moved when that node is lost
            here = ray.get_runtime_context().get_node_id()
            self.router = RelocatingRouter(resource, here, router_kw, self._router_moved).start()
        else:  # this process's child, on 127.0.0.1
            self.router = Router(host="127.0.0.1", **router_kw).start()
        self._publish_router(self.router.url)

    def _publish_router(self, url: str) -> None:
        """Where requests go from now on: the shared `Endpoints`, and the owner's `on_router_url` (the manager
        keeps slime's contract for plugins that build URLs themselves: `args.sglang_router_ip/port`)."""
        self.endpoints.router_url = url
        self.endpoints.router_losses.serving(url)
        if self.on_router_url is not None:
            self.on_router_url(url)

    def _router_moved(self, old_node: str | None, new_node: str, url: str) -> None:
        """The router's node was lost and the router runs on `new_node` now (RelocatingRouter): requests in
        flight on the old address are cut now and retried here (a dead host resets no connection)."""
        old_url = self.endpoints.router_url
        self._publish_router(url)
        if old_url and old_url != url:
            self.endpoints.router_losses.lost(
                old_url, f"its node {old_node} was lost; the router serves at {url} on node {new_node} now"
            )
        self.counters["router_moves"] += 1
        self.lost_nodes.note_if_gone(old_node, router_to=new_node)

    def _register(self, url: str) -> None:
        if self.router is not None:
            self.router.add_worker(url)  # remembered: re-registered if the router restarts
        else:
            # an existing router (--sglang-router-ip): register our engines, never start or stop it
            register_worker(self.endpoints.router_url, url)

    def unregister(self, url: str) -> None:
        try:
            if self.router is not None:
                self.router.remove_worker(url)
            else:
                unregister_worker(self.endpoints.router_url, url)
        except Exception as e:  # noqa: BLE001 - the router's health check drops it anyway
            logger.warning("could not remove dead engine %s from the router: %s", url, e)

    def admit(self, slot: EngineSlot) -> None:
        """Register the engine with the router and publish it (caller holds the lock)."""
        self._register(slot.url)
        slot.state = "healthy"
        self.publish()

    def publish(self) -> None:
        """Swap in the URLs of the engines that take requests (one assignment: readers never see half)."""
        self.endpoints.engine_urls = urls = [s.url for s in self.slots if s.state == "healthy" and s.url]
        self.endpoints.outage.published(len(urls))

    # ---- status ----
    def lost_node_status(self) -> list[dict[str, Any]]:
        """Each lost node, the engines it took and where each of them serves now (None: not yet, or failed)."""
        return self.lost_nodes.status(self.slots)

    def engine_status(self) -> list[dict[str, Any]]:
        return [s.as_dict() for s in self.slots]

    def info(self) -> dict[str, Any]:
        return {
            "router_url": self.endpoints.router_url,
            "router_pid": self.router.pid if self.router else None,
            "router_restarts": self.router.restarts if self.router else 0,
            "engine_urls": list(self.endpoints.engine_urls),
            "engines": self.engine_status(),
            "router_node_id": getattr(self.router, "node_id", None),
            "engine_deaths": self.counters["engine_deaths"],
            "engine_restarts": self.counters["engine_restarts"],
            "engine_bad_answers": {k: v for k, v in self.counters.items() if k.startswith("engine_bad_answer:")},
            **{k: self.counters[k] for k in NODE_COUNTERS},
            "lost_nodes": self.lost_node_status(),
            "startup_seconds": dict(self.startup_timings),
        }

    # ---- control: every call goes to each serving engine's node-0 actor ----
    def each(self, method: str, *a: Any) -> list[Any]:
        """Engines being replaced are skipped; a weight update is replayed on them before they serve.
        Engines awaiting weights get every call (an update from disk is what they wait for)."""
        with self.lock:
            if method in _REPLAYED:
                self.replayed[method] = a
            targets = [s.actor for s in self.slots if s.state in UPDATABLE_STATES]
            skipped = [s.rank for s in self.slots if s.state not in UPDATABLE_STATES]
        if skipped:
            logger.warning(
                "%s: skipping engine(s) %s (%s)", method, skipped, ", ".join(self.slots[i].state for i in skipped)
            )
        return ray.get([getattr(e, method).remote(*a) for e in targets])

    def kill_engine_during_push(self, index: int, at_update: int) -> None:
        """Fault injection: SIGKILL one engine's server at the `at_update`-th bucket of the next push."""
        ray.get(self.slots[index].actor.die_during_push.remote(at_update))

    def kill_engine(self, index: int) -> int | None:
        """Fault injection for tests and chaos runs: SIGKILL one engine's server."""
        actor = self.slots[index].actor
        pid = ray.get(actor.pid.remote())
        ray.get(actor.kill.remote())
        return pid

    def stop_steps(self) -> list[tuple[str, Any]]:
        """Each stop as its own step, so the caller can keep going when one fails. Actors are looked
        up when the step runs, so an engine replaced meanwhile is the one stopped."""
        steps: list[tuple[str, Any]] = [
            ("engine supervision", self.stopping.set),
            ("router", lambda: self.router and self.router.stop()),
        ]
        # every engine is asked to stop at once (each takes a few tenths of a second to end its server), then each
        # is waited for in its own step; an engine waiting for room has no server, only an actor Ray has not
        # placed: killed below
        stops: dict[int, list] = {}
        steps.append(
            (
                "engines (asked to stop)",
                lambda: stops.update(
                    {s.rank: [a.stop.remote() for a in s.actors] for s in self.slots if s.state != "unplaced"}
                ),
            )
        )
        steps += [(f"engine {s.rank}", lambda s=s: ray.get(stops.get(s.rank) or [], timeout=60)) for s in self.slots]
        steps += [(f"engine actor {s.rank}", lambda s=s: [ray.kill(a) for a in s.actors]) for s in self.slots]
        steps.append(("placement group", lambda: self.pg is not None and remove_placement_group(self.pg)))
        steps.append(("engine states", lambda: [setattr(s, "state", "stopped") for s in self.slots]))
        return steps
