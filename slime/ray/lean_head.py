"""A private local Ray head without the two daemons and the idle worker a slime run never asks anything of.

Why: of a cold start's ~27 CPU seconds on 2 cores, Ray's own Python daemons burnt ~5.7; two of them serve
nobody here. The autoscaler monitor has nothing to scale on a one-node private Ray (and `ray.shutdown()`
waited 1 s for it to die). The dashboard's API server, with `include_dashboard=False`, loads only Ray's
usage-stats module (usage stats are off: `RAY_USAGE_STATS_ENABLED=0`), and `ray.init` waits for it to
publish its address before returning: ~1.4 CPU seconds on the start's critical path for no use (Ray's
state API needs the dashboard's own modules, which `include_dashboard=False` never loads).
`ray.init` has no switch for either (`ray start --head --no-monitor` has one for the monitor only), so the
node `ray.init` builds is a subclass that skips them, for the duration of the call only; it also turns off
the workers Ray prestarts for the first driver (`LEAN_SYSTEM_CONFIG`).

Kept: the GCS, the raylet and its two agents (the raylet exits without them), the log monitor (actors'
logs reach the command: `log_to_driver`). The dashboard agent, when Ray would start it `--minimal` (its
dependencies are not installed) and no dashboard was asked for, serves nothing: a stand-in that writes its
"not in use" ports takes its place (slime.ray.idle_dashboard_agent; ~1 CPU s and ~0.4-0.7 s of the raylet's
wait before `ray.init` returns). Only a head `ray.init` starts itself is touched: joining a cluster
(`--ray-address`) builds a connect-only node, which starts nothing.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

_LOCK = threading.Lock()  # one patched `ray.init` at a time in a process

# Ray prestarts one idle worker per CPU when the first driver connects, whatever will run: a slime run needs
# one worker per actor (the manager, one per engine), started on demand, and one of the prestarted ones
# stayed idle in every measured run (~0.9 CPU s while the fork server preloads). A caller's own
# `_system_config` wins.
LEAN_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}


def _lean_node_class(base: type) -> type:
    class LeanHeadNode(base):  # type: ignore[misc, valid-type]
        """Ray's `Node`, without the autoscaler monitor and, unless a dashboard was asked for, the API server."""

        def __init__(self, ray_params: Any, *args: Any, **kwargs: Any):
            if kwargs.get("head"):
                ray_params.no_monitor = True
                ray_params._system_config = {**LEAN_SYSTEM_CONFIG, **(ray_params._system_config or {})}  # noqa: SLF001
            super().__init__(ray_params, *args, **kwargs)

        def start_api_server(self, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
            if include_dashboard:  # asked for by name: Ray's own start, dashboard and all
                super().start_api_server(include_dashboard=include_dashboard, raise_on_failure=raise_on_failure)

        def start_raylet(self, *args: Any, **kwargs: Any) -> None:
            idle = self.head and not self._ray_params.include_dashboard
            with idle_dashboard_agent() if idle else contextlib.nullcontext():
                super().start_raylet(*args, **kwargs)

    return LeanHeadNode


@contextlib.contextmanager
def idle_dashboard_agent() -> Iterator[None]:
    """Inside the block, the raylet Ray starts runs slime.ray.idle_dashboard_agent as its dashboard agent, when
    Ray's own would run `--minimal` (its dependencies missing) and the Ray internals this relies on are there."""
    import ray._private.services as services
    import ray._private.utils as ray_utils
    from ray._private import ray_constants

    try:
        import ray._raylet as raylet

        ports = (
            raylet.METRICS_AGENT_PORT_NAME,
            raylet.METRICS_EXPORT_PORT_NAME,
            raylet.DASHBOARD_AGENT_LISTEN_PORT_NAME,
        )
        build = services._build_python_executable_command_memory_profileable  # noqa: SLF001
        agent = ray_constants.PROCESS_TYPE_DASHBOARD_AGENT
    except AttributeError:  # another Ray: its own agent
        yield
        return
    if ray_utils.get_dashboard_dependency_error() is None:  # a full agent: it serves metrics and logs
        yield
        return
    from slime.ray import idle_dashboard_agent as stand_in

    script = str(Path(stand_in.__file__).resolve())

    def command(component: str, *args: Any, **kwargs: Any) -> list[str]:
        if component != agent:
            return build(component, *args, **kwargs)
        return [sys.executable, "-S", "-u", script, stand_in.PORT_NAMES_FLAG + ",".join(ports)]

    services._build_python_executable_command_memory_profileable = command  # noqa: SLF001
    try:
        yield
    finally:
        services._build_python_executable_command_memory_profileable = build  # noqa: SLF001


def first_missing_module(source: str) -> str | None:
    """The first top-level module `source`'s own import statements name that is not installed, found
    without importing any (None: all are there, or nothing is imported)."""
    import ast
    import importlib.util

    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if importlib.util.find_spec(top) is None:
                return top
    return None


@contextlib.contextmanager
def quick_dashboard_dependency_check() -> Iterator[None]:
    """Inside the block, Ray's test for its dashboard's dependencies (`get_dashboard_dependency_error`,
    which decides whether its agent runs `--minimal`) first looks for a top-level module of
    `ray.dashboard.optional_deps` that is not installed, and answers at once if one is missing. Ray's
    own test imports them all until one fails: aiohttp's web server and more, ~0.3 CPU s of the command's
    start for modules it never uses, beside the engines' preload on a small box. The answer is Ray's
    (a missing top-level module fails its import too); with all of them present, Ray's own test runs."""
    import importlib.util

    import ray._private.utils as ray_utils

    spec = importlib.util.find_spec("ray.dashboard.optional_deps")
    original = getattr(ray_utils, "get_dashboard_dependency_error", None)
    if original is None or spec is None or not spec.origin:  # another Ray: its own test
        yield
        return
    missing = first_missing_module(Path(spec.origin).read_text(encoding="utf-8"))

    def check() -> ImportError | None:
        if missing is not None:
            return ModuleNotFoundError(f"No module named {missing!r}", name=missing)
        return original()

    ray_utils.get_dashboard_dependency_error = check
    try:
        yield
    finally:
        ray_utils.get_dashboard_dependency_error = original


@contextlib.contextmanager
def lean_head() -> Iterator[None]:
    """Inside the block, a `ray.init()` that starts a local Ray starts it without the autoscaler monitor,
    (with `include_dashboard` not True) without the dashboard's API server, and without prestarted workers;
    whether Ray's dashboard dependencies are installed is found without importing them."""
    import ray._private.node as ray_node

    with _LOCK, quick_dashboard_dependency_check():
        original = ray_node.Node
        ray_node.Node = _lean_node_class(original)
        try:
            yield
        finally:
            ray_node.Node = original
