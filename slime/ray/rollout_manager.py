"""`RolloutManager`: the one Ray actor a trainer (or `slime-rollout`) talks to, as in slime.

It composes three plain objects, each with one job: the `Fleet` (router and engines: start,
health, offload/onload, weights, abort), the tool services (local sandbox, cluster-wide rate
limiters), and the `RolloutController` (data, plugins, samples -> batch). Rollout functions run in
this actor's process; its calls are threaded, so `status()` answers while a rollout runs.
A trainer brackets each weight push with `begin_weight_update()` / `end_weight_update(version)`
(`update_weights_from_disk` does it itself), so a fully-async rollout worker starts no group while
weights change and knows the version it generates with afterwards.
Start-up is all-or-nothing: if any part fails, everything already started is stopped; the
controller is built while the engines boot (cold start).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import ray

from slime.fleet.lost_nodes import NODE_COUNTERS
from slime.observability.node_losses import describe_lost_node, node_loss_metrics
from slime.observability.wandb_logger import WandbRun
from slime.weights import manager as weight_sync
from slime.ray.box import Box
from slime.ray.flags import ManagerConfig
from slime.tools.services import ToolServices
from slime.utils.endpoints import Endpoints
from slime.utils.startup_trace import mark

if TYPE_CHECKING:  # each imported where it is first used, in the actor (see `start`)
    from slime.fleet.fleet import Fleet
    from slime.rollout.controller import RolloutController

logger = logging.getLogger(__name__)
FLEET_COUNTERS = ("engine_deaths", "engine_restarts", *NODE_COUNTERS)  # each rollout reports its share (perf/*)


def log_warnings_to_stderr() -> None:
    """The manager's warnings (an engine died, a node was lost, the pool shrank or grew back) go to its
    stderr, which Ray forwards to the command's console. Without a handler of its own the process relies
    on Python's last-resort handler, which stops printing as soon as any handler sits on the root logger,
    as `StallGuard` does for the length of every rollout: exactly when those warnings come."""
    root = logging.getLogger()
    if not any(isinstance(h, logging.StreamHandler) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setLevel(logging.WARNING)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)


class RolloutManager:
    def __init__(self, args: Any, fork_server: str | None = None):
        from slime.engine.default_model import resolve_hf_checkpoint
        from slime.utils.plugin_args import completed

        log_warnings_to_stderr()
        args = completed(args)  # slime's train.py builds its namespace with slime's parser, not ours
        resolve_hf_checkpoint(args)  # as our commands do, also for callers that skip them (slime's train.py)
        self.args = args  # for slime's plugins (the controller), wandb, and the router's address (`_router_url`)
        self.config = ManagerConfig.from_args(args)  # every flag the manager and its fleet read, once
        self.report = self.config.report  # what the fleet's metric log reads
        self.fork_server = fork_server  # the node's engine fork server socket (warm engine starts), or None
        self.fleet: Fleet | None = None
        self.controller: RolloutController | None = None
        self.wandb_run: WandbRun | None = None
        self.tool_services = ToolServices()
        self._tool_handles: list[Any] = []  # what the tools' shared services need kept (and stopped)
        self.startup_timings: dict[str, float] = {}
        self.train_parallel_config: dict[str, Any] | None = None
        self._engine_lock: Any = None  # held by a trainer while it pushes weights (made on first use)
        self._restarts_pushed = 0  # engine restarts the trainer has already pushed weights to
        self._reported_lost: set[str] = set()  # lost nodes already named in a rollout's summary
        self._shut = False

    # ---- start-up ----
    def start(self) -> dict[str, Any]:
        t0 = time.monotonic()
        mark("manager: start")
        # The command imports this module only to name the actor class (`ray.remote`), during `ray.init`:
        # the fleet's HTTP client and the controller's modules load here, in the actor, instead.
        from slime.fleet.fleet import Fleet

        try:
            self.wandb_run = WandbRun.start(self.args)
            self._start_tool_services()
            fleet = self.fleet = (
                None
                if self.config.load_debug_rollout_data
                else Fleet(self.config.fleet, self.fork_server, on_router_url=self._router_url)
            )
            # the controller (tokenizer, data, plugins) is built while the engines boot: it only needs
            # the fleet's Endpoints object, which the fleet fills in as engines register
            with ThreadPoolExecutor(1, thread_name_prefix="controller-init") as pool:
                controller = pool.submit(self._build_controller, fleet.endpoints if fleet else Endpoints(), t0)
                if fleet is not None:
                    fleet.start()  # also sets args.sglang_router_ip/port (`_router_url`)
                    self.startup_timings.update(fleet.startup_timings)
                self.controller = controller.result()
            self.startup_timings["ready"] = time.monotonic() - t0
        except BaseException:
            self.shutdown()
            raise
        return self.info()

    def _router_url(self, url: str) -> None:
        """Where the fleet's router serves (at start, and after it moved), onto the namespace: slime's
        contract for plugins that build URLs themselves (`args.sglang_router_ip/port`)."""
        host, _, port = url.removeprefix("http://").rpartition(":")
        self.args.sglang_router_ip, self.args.sglang_router_port = host, int(port)

    def _build_controller(self, endpoints: Endpoints, t0: float) -> RolloutController:
        from slime.rollout.controller import RolloutController

        fleet = self.fleet
        controller = RolloutController(
            self.args,
            endpoints,
            tool_services=self.tool_services,
            wandb_run=self.wandb_run,
            fleet_counters=(lambda: {k: fleet.counters[k] for k in FLEET_COUNTERS}) if fleet else None,
        )
        self.startup_timings["controller"] = time.monotonic() - t0
        mark("manager: controller built")
        return controller

    def _start_tool_services(self) -> None:
        """Services the tools share, owned here so they outlive any rollout: each tool class of
        `--tool-config-path` starts its own (the local sandbox, its global rate limiter)."""
        path = self.config.tool_config_path
        if path:
            from slime.tools.registry import start_shared_services

            self.tool_services, self._tool_handles = start_shared_services(path)

    def info(self) -> dict[str, Any]:
        fleet = (
            self.fleet.info()
            if self.fleet
            else {
                "router_url": None,
                "router_pid": None,
                "router_restarts": 0,
                "engine_urls": [],
                "engines": [],
                "engine_deaths": 0,
                "engine_restarts": 0,
            }
        )
        return {
            **fleet,
            "sandbox_url": self.tool_services.sandbox_url,
            "rate_limiters": list(self.tool_services.limiter_names),
            "startup_seconds": dict(self.startup_timings),
        }

    # ---- the trainer's API (slime's names) ----
    def set_train_parallel_config(self, config: dict[str, Any]) -> None:
        """From then on `generate` returns one Box per data-parallel rank (slime's trainer contract)."""
        if not isinstance(config, dict) or not isinstance(config.get("dp_size"), int) or config["dp_size"] < 1:
            raise ValueError(f"set_train_parallel_config: needs {{'dp_size': int >= 1, ...}}, got {config!r}")
        self.train_parallel_config = dict(config)

    def generate(self, rollout_id: int) -> Box | list[Box]:
        """`Box(ray.put(batch))`; after `set_train_parallel_config`, one Box per DP rank (one put each)."""
        out = self.controller.generate(rollout_id, self.train_parallel_config)
        self._report_lost_nodes(rollout_id)
        if self.train_parallel_config is None:
            return Box(ray.put(out))
        return [Box(ray.put(rank)) for rank in out]

    def _report_lost_nodes(self, rollout_id: int) -> None:
        """Nodes lost since the last rollout's report: in its summary (`lost_nodes`, the CLI's line) and
        on the dashboard (`fleet/*`)."""
        if self.fleet is None or self.controller.last_summary is None:
            return
        new = [e for e in self.fleet.lost_node_status() if e["node_id"] not in self._reported_lost]
        self._reported_lost.update(e["node_id"] for e in new)
        self.controller.last_summary["lost_nodes"] = [describe_lost_node(e) for e in new]
        if new:
            from slime.observability import reporting

            reporting.log_fleet(self.report, rollout_id, node_loss_metrics(new), self.wandb_run)

    def get_num_rollout_per_epoch(self) -> int:
        source = self.controller.data_source
        if source is None:
            raise ValueError("get_num_rollout_per_epoch: no --prompt-data")
        return len(source) // self.config.rollout_batch_size

    def eval(self, rollout_id: int) -> dict[str, Any]:
        return self.controller.eval(rollout_id)

    def last_summary(self) -> dict[str, Any] | None:
        return self.controller.last_summary if self.controller else None

    def status(self) -> dict[str, Any]:
        """Answers while a rollout runs (the actor is threaded): the running rollout's progress and
        retries, the router, and each engine with its state (starting/healthy/dead/restarting/failed)."""
        st = self.controller.status() if self.controller else {"phase": "starting"}
        return {**st, **self.info()}

    def _engines(self, method: str, *a: Any) -> list[Any]:
        return self.fleet.each(method, *a) if self.fleet else []

    def offload(self) -> list[Any]:
        return self._engines("release_memory_occupation")

    def onload(self, tags: list[str] | None = None) -> list[Any]:
        return self._engines("resume_memory_occupation", tags)

    def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> list[Any]:
        """Every engine loads `model_path`; a background rollout worker is paused around it and
        resumes knowing `weight_version` (nested in a trainer's own begin/end it does nothing more)."""
        self.begin_weight_update()
        done = False
        try:
            out = self._engines("update_weights_from_disk", model_path, weight_version)
            done = True
            return out
        finally:
            self.end_weight_update(weight_version if done else None)

    def abort(self) -> list[Any]:
        return self._engines("abort_all")

    def save(self, rollout_id: int) -> None:
        self.controller.save(rollout_id)

    def load(self, rollout_id: int | None = None, directory: str | None = None) -> int | None:
        """Restore the data source from `--load`: the state saved at `rollout_id` (a trainer resuming
        from its checkpoint of that rollout, whose copy is in `directory`), else the newest; returns
        that rollout id."""
        source = self.controller.data_source if self.controller else None
        if source is None or not self.config.load:
            return None
        return source.load(directory or self.config.load, rollout_id)

    # ---- weights (slime's names; the engines' side is slime/weights/receive.py) ----
    def begin_weight_update(self) -> None:
        """Call before pushing weights: the fully-async rollout worker starts no new group until
        `end_weight_update` (with --partial-rollout it aborts its requests and keeps their tokens)."""
        if self.controller is not None:
            self.controller.begin_weight_update()

    def end_weight_update(self, weight_version: str | None = None) -> None:
        """Call after the push with the version the engines now serve (None when it failed): the
        worker drops what became too stale (--max-staleness), continues what it paused, resumes. The
        fleet learns the version a restarted engine must have before it serves."""
        if self.fleet is not None:
            self.fleet.note_weight_version(weight_version)
        if self.controller is not None:
            self.controller.end_weight_update(weight_version)

    def keep_pushed_weights(self, weight_version: str, kept: list[Any]) -> list[int]:
        """The trainer's push of `weight_version` completed; `kept` = [the ref of its named tensors in Ray's
        object store] (nested: this actor holds the ref, never the tensors). A replacement engine loads them
        at once instead of waiting for the next push (slime.fleet.awaiting_weights); the ranks of engines
        awaiting weights admitted with them now."""
        if self.fleet is None:
            return []
        return self.fleet.weight_gate.keep(weight_version, kept[0], self.fleet.slots)

    def get_updatable_engines_and_lock(self) -> tuple:
        """(engine actors, the weight lock, engines restarted since the last push, gpu counts, offsets, configs)."""
        if self._engine_lock is None:
            self._engine_lock = weight_sync.make_engine_lock()
        return weight_sync.get_updatable_engines_and_lock(self.fleet, self._engine_lock, self._new_engines())

    def _new_engines(self) -> int:
        return self.fleet.counters["engine_restarts"] - self._restarts_pushed if self.fleet else 0

    def recover_updatable_engines(self) -> int:
        """Return once no engine is dead or restarting (the fleet restarts them by itself; a
        restart has no event here, so this probes with a deadline); the count of new engines."""
        if self.fleet is not None:
            timeout = self.config.fleet.engine.engine_startup_timeout
            deadline = time.monotonic() + float(timeout)
            while any(s["state"] in ("dead", "restarting", "starting") for s in self.fleet.engine_status()):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"recover_updatable_engines: engines not back after {timeout:.0f}s (--engine-startup-timeout)"
                    )
                time.sleep(0.2)
        return self._new_engines()

    def clear_updatable_num_new_engines(self) -> None:
        """The trainer pushed its weights to the restarted engines too."""
        if self.fleet is not None:
            self._restarts_pushed = self.fleet.counters["engine_restarts"]

    def onload_weights(self) -> list[Any]:
        return weight_sync.onload_weights(self.fleet)

    def onload_kv(self) -> list[Any]:
        return weight_sync.onload_kv(self.fleet)

    def check_weights(self, action: str, checksums: dict[str, str] | None = None) -> list[dict]:
        return weight_sync.check_weights(self.fleet, action, checksums)

    def wandb_run_id(self) -> str | None:
        return self.wandb_run.id if self.wandb_run is not None else None

    def metrics_dir(self) -> str | None:
        from slime.observability.metrics_log import metrics_dir

        d = metrics_dir(self.report.observability, self.wandb_run)
        return str(d) if d is not None else None

    def dispose(self) -> None:
        """slime's end-of-training call: stop everything."""
        self.shutdown()

    # fault injection (killing engines mid-run) is not here: tests start slime.testing.fault_manager's subclass

    def shutdown(self) -> None:
        """Stop everything this manager started; each step runs even if an earlier one fails."""
        if self._shut:
            return
        self._shut = True
        steps: list[tuple[str, Any]] = [("controller", lambda: self.controller and self.controller.close())]
        steps += self.fleet.stop_steps() if self.fleet else []
        steps += [
            (f"tool service {type(h).__name__}", h.stop)
            for h in self._tool_handles
            if callable(getattr(h, "stop", None))
        ]
        steps.append(("wandb", lambda: self.wandb_run and self.wandb_run.finish(end_session=True)))
        for what, step in steps:
            try:
                step()
            except Exception as e:  # noqa: BLE001 - keep stopping the rest
                logger.warning("shutdown: stopping %s failed: %s", what, e)
            mark(f"exit: manager stopped {what}")
