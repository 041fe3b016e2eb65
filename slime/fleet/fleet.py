"""`Fleet`: the router and the engine pool, started together, controlled and healed as one.

Start-up is all-or-nothing: if any engine fails to start, everything already started is stopped
and the error carries that engine's log tail. Engines are Ray actors on a placement group, each
owning its server process; the router is a supervised child process restarted if it dies (with
`--router-resource`, on a node of its own and moved when that node is lost: slime.fleet.router_host).

Engines are supervised like the router. A watcher thread per engine blocks on a call that only
returns when the engine's server process exits (or its actor dies): an event, not a poll. A dead
engine is reported at once (a warning and the `engine_deaths` counter), taken out of the router
and of the shared `Endpoints` (so requests stop going there), and replaced: its actor is killed
and a new one created on the same placement-group bundle, started, given the latest weights the
fleet was told to load, and registered. `--engine-max-restarts` bounds the restarts per engine;
after that the engine is `failed` and the pool runs without it.

A lost Ray node (its raylet gone: preemption, a kernel panic, a drained host) takes its engines
with it; each is reported and replaced like any dead engine. Ray moves the placement-group bundles
of a dead node to surviving nodes with room (all of a node's bundles at once: Ray re-places the lost
bundles of a group together), so the replacement lands there; where no node has room within
`_PLACEMENT_WAIT_S`, the engine is `unplaced` with a warning and the pool shrinks, while it waits for
Ray to place it: a node with room that joins later (a node coming back) takes it, and the pool grows
back. `info()` lists the lost nodes, the engines they took and where each went, and where the router
went (`lost_nodes`; per engine `node_id` and `moved_from`; `NODE_COUNTERS`).

A replacement boots with the weights on disk. If the serving engines report another weight
version (a trainer pushed weights from memory, which the fleet does not hold), it stays out of the
router in state `awaiting_weights`: it is one of the updatable engines (slime's
`recover_updatable_engines` / `num_new_engines`), so the trainer's next push reaches it, and it is
registered when that push completes (its actor reports the push's end: `continue_generation`
after the updates, or an update from disk) and it reports the serving engines' version. So no
request is ever answered by stale weights while the others serve version N. Its count of pushes is
taken before it shows as updatable (a trainer may push to it at that very moment), and a wait for its
push that fails without its death is asked again (`_PUSH_WAIT_RETRIES` in a row: it is replaced).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group

from slime.engine.weight_version_answer import BadWeightVersion
from slime.fleet.engine_actor import EngineActor
from slime.fleet.flags import DEFAULT_ENGINE_MAX_RESTARTS
from slime.fleet.placement import bundle_strategy, create_engine_placement_group
from slime.fleet.router import Router, register_worker, unregister_worker
from slime.fleet.router_host import RelocatingRouter
from slime.utils.endpoints import Endpoints
from slime.utils.startup_trace import mark

logger = logging.getLogger(__name__)

ENGINE_STATES = ("starting", "healthy", "dead", "restarting", "awaiting_weights", "unplaced", "failed", "stopped")
UPDATABLE_STATES = ("healthy", "awaiting_weights")  # engines a weight push (or another control call) must reach
_PUSH_WAIT_S = 30.0  # an engine awaiting weights is asked again after this (so a stop is seen)
_PUSH_WAIT_RETRIES = 5  # failed waits in a row (not deaths) before an engine awaiting weights is replaced
# seconds a replacement may wait for a place on the cluster (its bundle re-placed after a node loss)
_PLACEMENT_WAIT_S = 120.0
# control calls whose effect a replacement engine must get too (replayed before it takes requests)
_REPLAYED = ("update_weights_from_disk",)
# what node losses did, counted over the run: nodes gone, engines placed on another node, engines left
# waiting for a node with room, router moves
NODE_COUNTERS = ("nodes_lost", "engines_moved", "engines_unplaced", "router_moves")


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


_EngineRemote = ray.remote(concurrency_groups={"watch": 1, "pushes": 1})(SupervisedEngineActor)


class NoRoomError(RuntimeError):
    """A replacement engine found no place on the cluster (its node is gone and no other has room)."""


def exit_notice(actor: Any) -> concurrent.futures.Future:
    """A future done when this supervised engine's server process exits (its exit code) or its actor
    dies (the error): what a weight push watches to notice the death at once (slime.engine.weight_sync).
    Queued behind the fleet's own watcher in the actor's "watch" group: both end with the process."""
    return actor.wait_exit.remote().future()


@dataclass
class EngineSlot:
    """One engine of the pool: its actors (one per node), where it serves, and its life so far."""

    rank: int
    actors: list[Any]
    bundles: list[int]
    url: str | None = None
    state: str = "starting"
    restarts: int = 0
    deaths: int = 0
    last_exit: Any = None
    node_id: str | None = None  # the Ray node serving it (node 0's, for a multi-node engine)
    moved_from: str | None = None  # the lost node it was last moved away from

    @property
    def actor(self) -> Any:
        return self.actors[0]  # node 0 takes the requests

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "url": self.url, "state": self.state, "restarts": self.restarts,
                "deaths": self.deaths, "last_exit": self.last_exit, "node_id": self.node_id,
                "moved_from": self.moved_from}


class Fleet:
    def __init__(self, args: Any, fork_server: str | None = None):
        self.args = args
        self.router: Router | None = None
        self.pg = None
        self.slots: list[EngineSlot] = []
        self.endpoints = Endpoints()
        self.startup_timings: dict[str, float] = {}
        self.counters: Counter = Counter()  # engine_deaths, engine_restarts, engine_failed
        self.max_restarts = int(getattr(args, "engine_max_restarts", DEFAULT_ENGINE_MAX_RESTARTS))
        self._stopping = threading.Event()
        self._lock = threading.RLock()  # slot replacement vs. control calls (see `each`)
        self._replay: dict[str, tuple[Any, ...]] = {}
        # fn(actor) run on a replacement engine before it takes requests (e.g. push the trainer's weights)
        self.replacement_hooks: list[Any] = []
        self.weight_version: str | None = None  # the version the serving engines last reported
        self._watchers: list[threading.Thread] = []
        self.lost_nodes: dict[str, dict[str, Any]] = {}  # node id -> engines it took, where they went
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

    # ---- start-up ----
    def start(self) -> Endpoints:
        """Engines boot while the router starts; returns when every engine is registered."""
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
        self._publish()
        self._serving_version()  # the boot version: what a replacement serves until a push changes it
        self.startup_timings["registered"] = time.monotonic() - t0
        for slot in self.slots:
            t = threading.Thread(target=self._watch, args=(slot,), name=f"engine-watch-{slot.rank}", daemon=True)
            t.start()
            self._watchers.append(t)
        return self.endpoints

    def _engine_layout(self) -> tuple[int, int, int]:
        """(engines, nodes per engine, bundles per node of an engine)."""
        args = self.args
        if args.rollout_backend != "sglang":
            return args.rollout_num_engines, 1, 1
        per_node = min(args.num_gpus_per_node, args.rollout_num_gpus_per_engine)
        nodes = max(1, args.rollout_num_gpus_per_engine // args.num_gpus_per_node)
        return args.rollout_num_gpus // per_node // nodes, nodes, per_node

    def _new_actor(self, rank: int, bundle: int, node_rank: int = 0, nnodes: int = 1,
                   dist_init_addr: str | None = None) -> Any:
        args = self.args
        if args.rollout_backend == "sglang":
            return _EngineRemote.options(num_cpus=0.2, num_gpus=0.2,
                                         scheduling_strategy=bundle_strategy(self.pg, bundle)
                                         ).remote(args, rank, node_rank, nnodes, dist_init_addr)
        return _EngineRemote.options(num_cpus=float(args.rollout_num_cpus_per_engine),
                                     scheduling_strategy=bundle_strategy(self.pg, bundle)
                                     ).remote(args, rank, fork_server=self.fork_server)

    def _launch_engines(self) -> list[Any]:
        """Create the engine actors on their bundles and start their servers (not awaited)."""
        self.pg = create_engine_placement_group(self.args)
        num_engines, nodes, per_node = self._engine_layout()
        for rank in range(num_engines):
            actors, bundles, dist_init_addr = [], [], None
            for node_rank in range(nodes):
                bundle = (rank * nodes + node_rank) * per_node
                actor = self._new_actor(rank, bundle, node_rank, nodes, dist_init_addr)
                if node_rank == 0 and nodes > 1:
                    # the other nodes of this engine join node 0's torch.distributed rendezvous
                    dist_init_addr = ray.get(actor.rendezvous_address.remote())
                actors.append(actor)
                bundles.append(bundle)
            self.slots.append(EngineSlot(rank, actors, bundles))
        return [a.start.remote() for a in self.all_engines]

    def _start_router(self) -> None:
        args = self.args
        if args.sglang_router_ip is not None:
            self.endpoints.router_url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
            return
        router_kw = {"policy": args.router_policy, "prometheus_port": args.router_prometheus_port,
                     "health_check_interval": args.router_health_check_interval, "log_dir": args.log_dir}
        resource = getattr(args, "router_resource", None)
        if resource:  # on a node of its own, moved when that node is lost
            here = ray.get_runtime_context().get_node_id()
            self.router = RelocatingRouter(resource, here, router_kw, self._router_moved).start()
        else:  # this process's child, on 127.0.0.1
            self.router = Router(host="127.0.0.1", **router_kw).start()
        self._publish_router(self.router.url)

    def _publish_router(self, url: str) -> None:
        """Where requests go from now on: the shared `Endpoints`, and slime's contract for plugins that
        build URLs themselves (`args.sglang_router_ip/port`)."""
        self.endpoints.router_url = url
        self.endpoints.router_losses.serving(url)
        host, _, port = url.removeprefix("http://").rpartition(":")
        self.args.sglang_router_ip, self.args.sglang_router_port = host, int(port)

    def _router_moved(self, old_node: str | None, new_node: str, url: str) -> None:
        """The router's node was lost and the router runs on `new_node` now (RelocatingRouter): requests in
        flight on the old address are cut now and retried here (a dead host resets no connection)."""
        old_url = self.endpoints.router_url
        self._publish_router(url)
        if old_url and old_url != url:
            self.endpoints.router_losses.lost(old_url, f"its node {old_node} was lost; the router serves at {url} "
                                                       f"on node {new_node} now")
        self.counters["router_moves"] += 1
        if old_node is not None and not _node_alive(old_node):
            self._note_node_loss(old_node, router_to=new_node)

    def _register(self, url: str) -> None:
        if self.router is not None:
            self.router.add_worker(url)  # remembered: re-registered if the router restarts
        else:
            # an existing router (--sglang-router-ip): register our engines, never start or stop it
            register_worker(self.endpoints.router_url, url)

    def _unregister(self, url: str) -> None:
        try:
            if self.router is not None:
                self.router.remove_worker(url)
            else:
                unregister_worker(self.endpoints.router_url, url)
        except Exception as e:  # noqa: BLE001 - the router's health check drops it anyway
            logger.warning("could not remove dead engine %s from the router: %s", url, e)

    def _publish(self) -> None:
        """Swap in the URLs of the engines that take requests (one assignment: readers never see half)."""
        self.endpoints.engine_urls = [s.url for s in self.slots if s.state == "healthy" and s.url]

    # ---- supervision ----
    def _watch(self, slot: EngineSlot) -> None:
        """Block until this engine's server exits; then report it and bring a new one up."""
        while not self._stopping.is_set():
            actor = slot.actor
            try:
                code: Any = ray.get(actor.wait_exit.remote())
            except ray.exceptions.RayActorError as e:
                code = f"actor died ({type(e).__name__})"
            except Exception as e:  # noqa: BLE001 - anything else also means we lost the engine
                code = f"{type(e).__name__}: {e}"
            if self._stopping.is_set() or slot.actor is not actor:
                return
            self._on_death(slot, code)
            if slot.state not in UPDATABLE_STATES:
                return

    def _on_death(self, slot: EngineSlot, code: Any) -> None:
        with self._lock:
            registered = slot.state == "healthy"
            if any(s.state == "healthy" for s in self.slots if s is not slot):
                self._serving_version(exclude=slot)  # remembered, in case every engine is gone later
            slot.state, slot.last_exit = "dead", code
            slot.deaths += 1
            self.counters["engine_deaths"] += 1
            self._publish()
        if slot.node_id is not None and not _node_alive(slot.node_id):
            self._note_node_loss(slot.node_id, slot)
        logger.warning("engine %d at %s died (exit code %s); %s", slot.rank, slot.url, code,
                       "restarting it" if slot.restarts < self.max_restarts and len(slot.actors) == 1
                       else "not restarting it")
        if slot.url and registered:
            self._unregister(slot.url)
        while not self._stopping.is_set():
            if len(slot.actors) > 1:
                self._fail(slot, "a multi-node engine is not restarted")
                return
            if slot.restarts >= self.max_restarts:
                self._fail(slot, f"restart budget spent (--engine-max-restarts {self.max_restarts})")
                return
            slot.restarts += 1
            self.counters["engine_restarts"] += 1
            slot.state = "restarting"
            try:
                self._replace(slot)
                return
            except NoRoomError as e:
                self._unplaced(slot, str(e))
                return
            except Exception as e:  # noqa: BLE001 - try again while the budget lasts
                slot.last_exit = f"restart failed: {type(e).__name__}"
                logger.warning("engine %d: restart %d/%d failed: %s", slot.rank, slot.restarts,
                               self.max_restarts, str(e)[:2000])

    def _fail(self, slot: EngineSlot, why: str) -> None:
        slot.state = "failed"
        self.counters["engine_failed"] += 1
        logger.error("engine %d is gone for the rest of the run: %s; %d engine(s) left", slot.rank, why,
                     sum(s.state == "healthy" for s in self.slots))

    def _place(self, slot: EngineSlot, actor: Any) -> None:
        """Wait until the replacement has a node; if it is another one, the old node is gone (a bundle
        only moves when its node dies). No place within `_PLACEMENT_WAIT_S`: `NoRoomError` (the caller
        then waits on for a node with room, `_await_room`)."""
        try:
            node = ray.get(actor.node_id.remote(), timeout=_PLACEMENT_WAIT_S)
        except ray.exceptions.GetTimeoutError:
            raise NoRoomError(f"no room for a replacement on the surviving nodes within {_PLACEMENT_WAIT_S:.0f}s "
                              f"(its node {slot.node_id} is gone; cluster resources: {ray.cluster_resources()}); "
                              "the pool shrinks until a node with room joins") from None
        self._placed(slot, node)

    def _placed(self, slot: EngineSlot, node: str) -> None:
        old = slot.node_id
        if old is not None and node != old:
            self._note_node_loss(old, slot)
            slot.moved_from = old
            self.counters["engines_moved"] += 1
            logger.warning("engine %d moved from lost node %s to node %s", slot.rank, old, node)
        slot.node_id = node

    def _note_node_loss(self, node_id: str, slot: EngineSlot | None = None, router_to: str | None = None) -> None:
        """Record (once per node) that `node_id` is gone and took this engine (or the router, now on `router_to`)."""
        with self._lock:
            lost = self.lost_nodes.get(node_id)
            if lost is None:
                lost = self.lost_nodes[node_id] = {"node_id": node_id, "lost_at": time.time(), "engines": [],
                                                   "router_moved_to": None}
                self.counters["nodes_lost"] += 1
                logger.warning("Ray node %s is gone (its raylet died or was drained)", node_id)
            if slot is not None and slot.rank not in lost["engines"]:
                lost["engines"].append(slot.rank)
            if router_to is not None:
                lost["router_moved_to"] = router_to

    def _unplaced(self, slot: EngineSlot, why: str) -> None:
        """No node has room for this engine now: the pool goes on without it, and it waits (on Ray's
        placement, an event) for a node with room to join."""
        slot.state, slot.last_exit = "unplaced", why
        self.counters["engines_unplaced"] += 1
        logger.warning("engine %d: %s; %d of %d engines serve", slot.rank, why, self._serving(), len(self.slots))
        threading.Thread(target=self._await_room, args=(slot, slot.actor), name=f"engine-room-{slot.rank}",
                         daemon=True).start()

    def _await_room(self, slot: EngineSlot, actor: Any) -> None:
        """Block until Ray places the waiting engine (a node with room joined), then bring it up and
        watch it like any engine. Its actor is killed at stop, which ends the wait."""
        try:
            node = ray.get(actor.node_id.remote())
        except Exception:  # noqa: BLE001 - stopped (its actor killed), or its new node died at once
            if not self._stopping.is_set() and slot.actor is actor:
                self._on_death(slot, "its placement failed")
            return
        if self._stopping.is_set() or slot.actor is not actor:
            return
        self._placed(slot, node)
        logger.warning("engine %d found room on node %s (a node joined): starting it", slot.rank, node)
        slot.state = "restarting"
        try:
            self._bring_up(slot, actor)
        except Exception as e:  # noqa: BLE001 - handled as a death: restarted while the budget lasts
            self._on_death(slot, f"restart failed: {type(e).__name__}: {str(e)[:300]}")
        if slot.state in UPDATABLE_STATES:
            self._watch(slot)

    def _serving(self) -> int:
        return sum(s.state == "healthy" for s in self.slots)

    def _replace(self, slot: EngineSlot) -> None:
        """Kill the dead engine's actor and start a new one on the same bundle."""
        old = slot.actor
        try:
            ray.kill(old)
        except Exception:  # noqa: BLE001 - already gone
            pass
        actor = self._new_actor(slot.rank, slot.bundles[0])
        slot.actors = [actor]  # from here on, stop() stops the new one
        self._place(slot, actor)
        self._bring_up(slot, actor)

    def _bring_up(self, slot: EngineSlot, actor: Any) -> None:
        """Start the placed replacement, give it what the others got, and admit it (or let it await weights)."""
        timeout = float(getattr(self.args, "engine_startup_timeout", 300.0)) + 60.0
        url = ray.get(actor.start.remote(), timeout=timeout)
        if self._stopping.is_set():
            return
        with self._lock:
            for method, call_args in self._replay.items():
                ray.get(getattr(actor, method).remote(*call_args), timeout=600)
            for hook in self.replacement_hooks:
                hook(actor)
            slot.url = url
            serving = self._serving_version(exclude=slot)
            try:
                mine = ray.get(actor.get_weight_version.remote(), timeout=60)
            except ray.exceptions.RayActorError:
                raise
            except Exception as e:  # noqa: BLE001 - an engine without /get_weight_version: nothing to compare
                mine = None if self._bad_version_answer(e, slot.rank) else serving
            if serving is not None and mine != serving:
                # counted before the trainer can see it: a push that starts the moment it is updatable
                # (its state, read without this lock) must count as the one it waits for
                seen = ray.get(actor.push_count.remote(), timeout=60)  # the replayed ones do not count
                slot.state = "awaiting_weights"
                threading.Thread(target=self._await_weights, args=(slot, actor, seen), daemon=True,
                                 name=f"engine-weights-{slot.rank}").start()
                logger.warning("engine %d replaced at %s with weight version %s; the others serve %s: it takes "
                               "requests after the trainer's next push (restart %d/%d)", slot.rank, url, mine,
                               serving, slot.restarts, self.max_restarts)
                return
            self._admit(slot)
        logger.warning("engine %d replaced: serving at %s on node %s (restart %d/%d); %d of %d engines serve",
                       slot.rank, url, slot.node_id, slot.restarts, self.max_restarts, self._serving(), len(self.slots))

    def note_weight_version(self, version: str | None) -> None:
        """The trainer pushed `version` to the serving engines (the manager's `end_weight_update`): what a
        replacement must have before it serves, even if every engine died at once and none can be asked."""
        if version is not None:
            with self._lock:
                self.weight_version = str(version)

    def _admit(self, slot: EngineSlot) -> None:
        """Register the engine with the router and publish it (caller holds the lock)."""
        self._register(slot.url)
        slot.state = "healthy"
        self._publish()

    def _serving_version(self, exclude: EngineSlot | None = None) -> str | None:
        """The weight version the serving engines report (remembered in `weight_version`); the last
        one known when none serves."""
        for s in self.slots:
            if s is not exclude and s.state == "healthy":
                try:
                    self.weight_version = ray.get(s.actor.get_weight_version.remote(), timeout=60)
                    break
                except Exception as e:  # noqa: BLE001 - dying too: its watcher reports it; ask the next one
                    self._bad_version_answer(e, s.rank)
                    continue
        return self.weight_version

    def _bad_version_answer(self, exc: BaseException, rank: int) -> bool:
        """Whether `exc` is an engine's malformed `/get_weight_version` answer: then counted (by field)
        and logged, and the version is never taken from it (a replacement waits for the next push)."""
        cause = getattr(exc, "cause", exc)  # Ray wraps what the actor raised
        if not isinstance(cause, BadWeightVersion):
            return False
        self.counters[cause.reason] += 1
        logger.warning("engine %d: %s; its weight version is not trusted", rank, cause)
        return True

    def _await_weights(self, slot: EngineSlot, actor: Any, seen: int) -> None:
        """Wait for the first complete push to this engine, then admit it. Any push that reaches it
        after its restart is the trainer's current weights (a trainer pushes its newest weights to every
        updatable engine), so it is not compared with the others again: they may still be receiving."""
        failures = 0
        while not self._stopping.is_set() and slot.actor is actor and slot.state == "awaiting_weights":
            try:
                count, version = ray.get(actor.wait_push.remote(seen, _PUSH_WAIT_S), timeout=_PUSH_WAIT_S + 60)
                failures = 0
            except ray.exceptions.RayActorError:  # the actor died: its watcher replaces it
                return
            except Exception as e:  # noqa: BLE001 - e.g. a late answer on a loaded host: not a death, ask again
                failures += 1
                if not self._push_wait_failed(slot, actor, failures, e):
                    return
                continue
            if count <= seen:
                continue
            with self._lock:
                if self._stopping.is_set() or slot.actor is not actor or slot.state != "awaiting_weights":
                    return
                if version is not None:
                    self.weight_version = version
                self._admit(slot)
            logger.warning("engine %d has the current weights (version %s): serving at %s", slot.rank, version,
                           slot.url)
            return

    def _push_wait_failed(self, slot: EngineSlot, actor: Any, failures: int, exc: BaseException) -> bool:
        """A wait for this engine's push failed without its death: whether to ask again. After
        `_PUSH_WAIT_RETRIES` failures in a row it is handled as dead (its actor killed: its watcher
        replaces it within the restart budget), so an engine that cannot answer never waits for ever."""
        reason = f"{type(exc).__name__}: {str(exc)[:300]}"
        if failures >= _PUSH_WAIT_RETRIES:
            logger.warning("engine %d awaiting weights: %d waits for its push failed (last: %s); replacing it",
                           slot.rank, failures, reason)
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone: its watcher reports it either way
                pass
            return False
        logger.warning("engine %d awaiting weights: waiting for its push failed (%s); asking again (%d/%d)",
                       slot.rank, reason, failures, _PUSH_WAIT_RETRIES)
        return not self._stopping.wait(min(float(failures), _PUSH_WAIT_S))  # a failing call returns at once

    # ---- status ----
    def lost_node_status(self) -> list[dict[str, Any]]:
        """Each lost node, the engines it took and where each of them serves now (None: not yet, or failed)."""
        with self._lock:
            return [{**lost, "engines": list(lost["engines"]),
                     "moved_to": {r: self.slots[r].node_id if self.slots[r].moved_from == lost["node_id"] else None
                                  for r in lost["engines"]}}
                    for lost in self.lost_nodes.values()]

    def engine_status(self) -> list[dict[str, Any]]:
        return [s.as_dict() for s in self.slots]

    def info(self) -> dict[str, Any]:
        return {"router_url": self.endpoints.router_url,
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
                "startup_seconds": dict(self.startup_timings)}

    # ---- control: every call goes to each serving engine's node-0 actor ----
    def each(self, method: str, *a: Any) -> list[Any]:
        """Engines being replaced are skipped; a weight update is replayed on them before they serve.
        Engines awaiting weights get every call (an update from disk is what they wait for)."""
        with self._lock:
            if method in _REPLAYED:
                self._replay[method] = a
            targets = [s.actor for s in self.slots if s.state in UPDATABLE_STATES]
            skipped = [s.rank for s in self.slots if s.state not in UPDATABLE_STATES]
        if skipped:
            logger.warning("%s: skipping engine(s) %s (%s)", method, skipped,
                           ", ".join(self.slots[i].state for i in skipped))
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
        steps: list[tuple[str, Any]] = [("engine supervision", self._stopping.set),
                                        ("router", lambda: self.router and self.router.stop())]
        # an engine waiting for room has no server, only an actor Ray has not placed: killed below
        steps += [(f"engine {s.rank}", lambda s=s: s.state == "unplaced" or ray.get([a.stop.remote() for a in s.actors],
                                                                                    timeout=60))
                  for s in self.slots]
        steps += [(f"engine actor {s.rank}", lambda s=s: [ray.kill(a) for a in s.actors]) for s in self.slots]
        steps.append(("placement group", lambda: self.pg is not None and remove_placement_group(self.pg)))
        steps.append(("engine states", lambda: [setattr(s, "state", "stopped") for s in self.slots]))
        return steps


def _node_alive(node_id: str) -> bool:
    """Whether Ray's control store still counts `node_id` among the live nodes."""
    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())
