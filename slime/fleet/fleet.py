"""`Fleet`: the router and the engine pool, started together and controlled as one.

Start-up is all-or-nothing: if any engine fails to start, everything already started is stopped
and the error carries that engine's log tail. Engines are Ray actors on a placement group, each
owning its server process; the router is a supervised child process restarted if it dies.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group

from slime.fleet.engine_actor import EngineActor
from slime.fleet.placement import bundle_strategy, create_engine_placement_group
from slime.fleet.router import Router, register_worker
from slime.utils.endpoints import Endpoints

logger = logging.getLogger(__name__)


class Fleet:
    def __init__(self, args: Any):
        self.args = args
        self.router: Router | None = None
        self.pg = None
        self.all_engines: list[Any] = []
        self.engines: list[Any] = []  # node-0 actor of each engine: the ones that take requests
        self.endpoints = Endpoints()
        self.startup_timings: dict[str, float] = {}

    def start(self) -> Endpoints:
        """Engines boot while the router starts; returns when every engine is registered."""
        t0 = time.monotonic()
        refs = self._launch_engines()
        self._start_router()
        self.startup_timings["router"] = time.monotonic() - t0
        urls = ray.get(refs)  # the first engine failure is raised here
        self.startup_timings["engines"] = time.monotonic() - t0
        nodes_per_engine = len(self.all_engines) // max(1, len(self.engines))
        self.endpoints.engine_urls = urls[::nodes_per_engine]
        for url in self.endpoints.engine_urls:
            if self.router is not None:
                self.router.add_worker(url)  # remembered: re-registered if the router restarts
            else:
                # an existing router (--sglang-router-ip): register our engines, never start or stop it
                register_worker(self.endpoints.router_url, url)
        self.startup_timings["registered"] = time.monotonic() - t0
        return self.endpoints

    def _launch_engines(self) -> list[Any]:
        """Create the engine actors on their bundles and start their servers (not awaited)."""
        args = self.args
        self.pg = create_engine_placement_group(args)
        if args.rollout_backend == "sglang":
            per_node = min(args.num_gpus_per_node, args.rollout_num_gpus_per_engine)
            nodes_per_engine = max(1, args.rollout_num_gpus_per_engine // args.num_gpus_per_node)
            num_engines = args.rollout_num_gpus // per_node // nodes_per_engine
            actor_cls = ray.remote(EngineActor)
            for rank in range(num_engines):
                dist_init_addr = None
                for node_rank in range(nodes_per_engine):
                    actor = actor_cls.options(
                        num_cpus=0.2, num_gpus=0.2,
                        scheduling_strategy=bundle_strategy(self.pg, (rank * nodes_per_engine + node_rank) * per_node),
                    ).remote(args, rank, node_rank, nodes_per_engine, dist_init_addr)
                    if node_rank == 0 and nodes_per_engine > 1:
                        # the other nodes of this engine join node 0's torch.distributed rendezvous
                        dist_init_addr = ray.get(actor.rendezvous_address.remote())
                    self.all_engines.append(actor)
            self.engines = self.all_engines[::nodes_per_engine]
        else:
            cpus = float(args.rollout_num_cpus_per_engine)
            for rank in range(args.rollout_num_engines):
                self.all_engines.append(ray.remote(EngineActor).options(
                    num_cpus=cpus, scheduling_strategy=bundle_strategy(self.pg, rank)).remote(args, rank))
            self.engines = list(self.all_engines)
        return [e.start.remote() for e in self.all_engines]

    def _start_router(self) -> None:
        args = self.args
        if args.sglang_router_ip is None:
            self.router = Router(host="127.0.0.1", policy=args.router_policy,
                                 prometheus_port=args.router_prometheus_port,
                                 health_check_interval=args.router_health_check_interval, log_dir=args.log_dir)
            self.router.start()
            self.endpoints.router_url = self.router.url
        else:
            self.endpoints.router_url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"

    def info(self) -> dict[str, Any]:
        return {"router_url": self.endpoints.router_url,
                "router_pid": self.router.pid if self.router else None,
                "router_restarts": self.router.restarts if self.router else 0,
                "engine_urls": list(self.endpoints.engine_urls),
                "startup_seconds": dict(self.startup_timings)}

    # ---- control: every call goes to each engine's node-0 actor ----
    def each(self, method: str, *a: Any) -> list[Any]:
        return ray.get([getattr(e, method).remote(*a) for e in self.engines])

    def kill_engine(self, index: int) -> int | None:
        """Fault injection for tests and chaos runs: SIGKILL one engine's server."""
        pid = ray.get(self.engines[index].pid.remote())
        ray.get(self.engines[index].kill.remote())
        return pid

    def stop_steps(self) -> list[tuple[str, Any]]:
        """Each stop as its own step, so the caller can keep going when one fails."""
        steps: list[tuple[str, Any]] = [("router", lambda: self.router and self.router.stop())]
        steps += [(f"engine {i}", lambda e=e: ray.get(e.stop.remote(), timeout=60))
                  for i, e in enumerate(self.all_engines)]
        steps += [(f"engine actor {i}", lambda e=e: ray.kill(e)) for i, e in enumerate(self.all_engines)]
        steps.append(("placement group", lambda: self.pg is not None and remove_placement_group(self.pg)))
        return steps
