"""RolloutManager: starts the router and the engine pool, creates the controller, and is the
one handle a trainer (or `slime-rollout`) talks to.

Start-up is all-or-nothing: if any engine fails to start, everything already started is
stopped and the error carries that engine's log tail.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group

from slime.fleet.router import Router, register_worker
from slime.ray.box import Box
from slime.fleet.engine_actor import EngineActor
from slime.fleet.placement import bundle_strategy, create_engine_placement_group
from slime.ray.rollout_controller import RolloutController

logger = logging.getLogger(__name__)


class RolloutManager:
    def __init__(self, args: Any):
        self.args = args
        self.router: Router | None = None
        self.pg = None
        self.all_engines: list[Any] = []
        self.engines: list[Any] = []  # node-0 actor of each engine: the ones that take requests
        self.engine_urls: list[str] = []
        self.controller = None
        self.wandb_run_id: str | None = None
        self.tool_services: dict[str, Any] = {"sandbox_url": None, "sandbox": None, "limiters": {}}
        self.startup_timings: dict[str, float] = {}
        self._shut = False

    # ---- start-up ----
    def start(self) -> dict[str, Any]:
        """Engines, router and controller boot concurrently; returns when all are ready."""
        t0 = time.monotonic()
        timings: dict[str, float] = {}
        try:
            engine_refs = [] if self.args.load_debug_rollout_data else self._launch_engines()
            self.wandb_run_id = self._init_wandb()
            self.tool_services = self._prepare_tool_services()
            env = {"SLIME_SANDBOX_URL": self.tool_services["sandbox_url"]} if self.tool_services["sandbox_url"] else {}
            self.controller = ray.remote(RolloutController).options(
                num_cpus=0, max_concurrency=4, runtime_env={"env_vars": env} if env else None,
            ).remote(self.args, self.wandb_run_id)
            if engine_refs:
                self._start_router()
                timings["router"] = time.monotonic() - t0
                urls = ray.get(engine_refs)  # the first engine failure is raised here
                timings["engines"] = time.monotonic() - t0
                nodes_per_engine = len(self.all_engines) // max(1, len(self.engines))
                self.engine_urls = urls[::nodes_per_engine]
                self.args.rollout_engine_urls = list(self.engine_urls)
                self._register_engines()
                timings["registered"] = time.monotonic() - t0
            ray.get(self.controller.set_endpoints.remote(self.args.sglang_router_ip, self.args.sglang_router_port,
                                                         self.engine_urls))
            timings["controller"] = time.monotonic() - t0
        except BaseException:
            self.shutdown()
            raise
        self.startup_timings = timings
        return self.info()

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
            args.sglang_router_ip, args.sglang_router_port = self.router.host, self.router.port

    def _register_engines(self) -> None:
        for url in self.engine_urls:
            if self.router is not None:
                self.router.add_worker(url)  # remembered: re-registered if the router restarts
            else:
                # an existing router (--sglang-router-ip): register our engines, never start or stop it
                register_worker(f"http://{self.args.sglang_router_ip}:{self.args.sglang_router_port}", url)

    def _prepare_tool_services(self) -> dict[str, Any]:
        """Long-lived services the tools share, owned here so they outlive any worker: the local
        sandbox (`sandbox_fusion_url: local`) and one global rate limiter per sandbox tool."""
        path = getattr(self.args, "tool_config_path", None)
        if not path:
            return {"sandbox_url": None, "sandbox": None, "limiters": {}}
        import yaml

        from slime.tools.sandbox_fusion_tool import prepare_sandbox_services

        try:
            entries = (yaml.safe_load(Path(path).read_text()) or {}).get("tools") or []
        except (OSError, yaml.YAMLError, AttributeError):
            entries = []  # the controller's tool registry reports what is wrong with the file
        return prepare_sandbox_services(entries if isinstance(entries, list) else [])

    def _init_wandb(self) -> str | None:
        if not getattr(self.args, "use_wandb", False):
            return None
        from slime.observability.wandb_logger import init_wandb_primary

        return init_wandb_primary(self.args)

    def info(self) -> dict[str, Any]:
        return {"router_url": f"http://{self.args.sglang_router_ip}:{self.args.sglang_router_port}"
                if self.args.sglang_router_ip else None,
                "router_pid": self.router.pid if self.router else None,
                "router_restarts": self.router.restarts if self.router else 0,
                "engine_urls": list(self.engine_urls),
                "sandbox_url": self.tool_services["sandbox_url"],
                "rate_limiters": sorted(self.tool_services["limiters"]),
                "startup_seconds": dict(self.startup_timings)}

    # ---- the trainer's API ----
    def generate(self, rollout_id: int) -> Box:
        return ray.get(self.controller.generate.remote(rollout_id))

    def eval(self, rollout_id: int) -> dict[str, Any]:
        return ray.get(self.controller.eval.remote(rollout_id))

    def last_summary(self) -> dict[str, Any] | None:
        return ray.get(self.controller.get_last_summary.remote())

    def status(self) -> dict[str, Any]:
        """Answers while a rollout runs (both actors are threaded)."""
        st = ray.get(self.controller.status.remote()) if self.controller else {"phase": "starting"}
        return {**st, **self.info()}

    def offload(self) -> list[Any]:
        return ray.get([e.release_memory_occupation.remote() for e in self.engines])

    def onload(self, tags: list[str] | None = None) -> list[Any]:
        return ray.get([e.resume_memory_occupation.remote(tags) for e in self.engines])

    def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> list[Any]:
        return ray.get([e.update_weights_from_disk.remote(model_path, weight_version) for e in self.engines])

    def abort(self) -> list[Any]:
        return ray.get([e.abort_all.remote() for e in self.engines])

    def save(self, rollout_id: int) -> None:
        ray.get(self.controller.save.remote(rollout_id))

    # ---- fault injection, for tests and chaos runs ----
    def kill_engine(self, index: int) -> int | None:
        pid = ray.get(self.engines[index].pid.remote())
        ray.get(self.engines[index].kill.remote())
        return pid

    def router_pid(self) -> int | None:
        return self.router.pid if self.router else None

    def router_alive(self) -> bool:
        return bool(self.router and self.router.alive())

    def shutdown(self) -> None:
        """Stop everything this manager started; each step runs even if an earlier one fails."""
        if self._shut:
            return
        self._shut = True
        steps = [("router", lambda: self.router and self.router.stop())]
        for i, e in enumerate(self.all_engines):
            steps.append((f"engine {i}", lambda e=e: ray.get(e.stop.remote(), timeout=60)))
        steps += [(f"engine actor {i}", lambda e=e: ray.kill(e)) for i, e in enumerate(self.all_engines)]
        steps.append(("controller", lambda: self.controller is not None and ray.kill(self.controller)))
        steps.append(("sandbox", lambda: self.tool_services["sandbox"] and self.tool_services["sandbox"].stop()))
        steps.append(("placement group", lambda: self.pg is not None and remove_placement_group(self.pg)))
        if getattr(self.args, "use_wandb", False):
            from slime.observability.wandb_logger import finish

            steps.append(("wandb", finish))
        for what, step in steps:
            try:
                step()
            except Exception as e:  # noqa: BLE001 - keep stopping the rest
                logger.warning("shutdown: stopping %s failed: %s", what, e)
