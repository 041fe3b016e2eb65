"""`RolloutRuntime`: the services the rollout code of one controller shares, as one object.

The controller creates it once (engine client, progress, tool services) and hands it to our
rollout functions as their `runtime=` argument. Plugins written for slime only receive `args`, so
they reach the same object through `current()`: the process's one binding, an explicit cache
keyed by process id (a forked child never talks through its parent's sessions). slime's own
`GenerateState` is a per-process singleton for the same reason.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from slime.rollout.engine_client import EngineClient
from slime.rollout.flags import RolloutRunConfig
from slime.rollout.slime_http_client import SlimeHttpClient
from slime.utils.async_utils import run
from slime.utils.endpoints import Endpoints, rollout_num_engines
from slime.utils.gc_freeze import freeze_startup_heap
from slime.utils.plugin_args import completed
from slime.tools.services import ToolServices
from slime.tools.registry import ToolSet
from slime.tools.tool_sets import ToolSetCache

logger = logging.getLogger(__name__)


@dataclass
class RolloutRuntime:
    args: Any
    client: EngineClient
    tool_services: ToolServices = field(default_factory=ToolServices)
    tool_sets: ToolSetCache = field(default_factory=ToolSetCache)  # --tool-config-path's tools, closed with it
    _shared: dict[str, Any] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)  # a factory may build other shared state
    _closers: list[Callable[[], Any]] = field(default_factory=list)
    owned_by_binding: bool = False  # nobody else holds it (`current(args)` made it): closed when unbound or replaced
    closing: asyncio.Task | None = None  # the closing, when `close()` was called from a coroutine
    # slime's `http_utils._http_client` for slime-style plugins (made here as slime's RolloutManager calls
    # `init_http_client`; see slime_http_client), closed with the engine client
    slime_http: SlimeHttpClient = field(init=False)
    _config: RolloutRunConfig | None = field(default=None, init=False, repr=False)

    @property
    def config(self) -> RolloutRunConfig:
        """The flags our rollout code reads, read off `args` once, on first use (the namespace a
        plugin's `args` or the controller bound; code below gets this, not `args`)."""
        if self._config is None:
            self._config = RolloutRunConfig.from_args(completed(self.args))
        return self._config

    def reading(self, config: RolloutRunConfig) -> "RolloutRuntime":
        """Use `config`, already read off `args` by whoever made this runtime, as its `config`."""
        self._config = config
        return self

    def __post_init__(self) -> None:
        self.slime_http = SlimeHttpClient(self.client)

    @property
    def progress(self):
        return self.client.progress

    @property
    def tokenizer(self):
        return self.client.tokenizer

    def shared(self, key: str, factory: Callable[[], Any]) -> Any:
        """State a plugin builds once per runtime (tool sets, template checks), under its own key."""
        with self._lock:
            if key not in self._shared:
                self._shared[key] = factory()
            return self._shared[key]

    def on_close(self, closer: Callable[[], Any]) -> None:
        """Run `closer` when the controller closes the runtime (shared servers a plugin started)."""
        with self._lock:
            self._closers.append(closer)

    def close_shared(self) -> None:
        """Run the `on_close` closers, newest first; one that fails is logged and the rest still run."""
        with self._lock:
            closers, self._closers = self._closers[::-1], []
        for closer in closers:
            try:
                closer()
            except Exception:  # noqa: BLE001 - one stuck server must not keep the others running
                logger.exception("rollout runtime: closing %r failed", closer)

    def close(self) -> None:
        """Stop what plugins started for it (`on_close`), then close its tool sets and its engine
        client's HTTP sessions on every loop they were opened on (the process's background loop among
        them). Called from a coroutine (a test binding another runtime), waiting would block that very
        loop, whose session must close on it: the closing is then a task of that loop."""
        self.close_shared()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            run(self._close_sessions())
        else:
            self.closing = loop.create_task(self._close_sessions())

    async def _close_sessions(self) -> None:
        try:
            await self.tool_sets.close()
        finally:
            try:
                await self.slime_http.close()
            finally:
                await self.client.close()

    def bind(self) -> "RolloutRuntime":
        """Make this the runtime that slime-style plugins of this process see (a previous one the
        binding owned is closed: nothing else holds it). The first binding of a process freezes what it
        holds by then out of garbage collection (`freeze_startup_heap`)."""
        freeze_startup_heap()
        previous = _bound.get(os.getpid())
        _bound[os.getpid()] = self
        if previous is not None and previous is not self and previous.owned_by_binding:
            previous.close()
        return self


# The process's binding (see module docstring); key: os.getpid().
_bound: dict[int, RolloutRuntime] = {}


def bound() -> RolloutRuntime | None:
    """The runtime bound in this process, or None."""
    return _bound.get(os.getpid())


def current(args: Any = None) -> RolloutRuntime:
    """The runtime bound in this process. Outside a controller (a plugin run by hand, a unit test),
    one is created from `args` (router at `--sglang-router-ip/--sglang-router-port`) and bound."""
    rt = _bound.get(os.getpid())
    if rt is not None:
        return rt
    if args is None:
        raise RuntimeError(
            "no rollout runtime in this process: rollout functions run inside the RolloutManager "
            "(or bind one with RolloutRuntime(...).bind())"
        )
    args = completed(args)
    config = RolloutRunConfig.from_args(args)
    router = f"http://{config.sglang_router_ip}:{config.sglang_router_port}" if config.sglang_router_ip else None
    client = EngineClient.of(config, Endpoints(router), engines=rollout_num_engines(args))
    return RolloutRuntime(args, client, owned_by_binding=True).reading(config).bind()


def config_for(args: Any, runtime: RolloutRuntime | None) -> RolloutRunConfig:
    """The config of `args` for code a plugin reached with it: the runtime's (read once) when `args` is the
    namespace the runtime holds (every group of the controller's rollouts), else read off `args` now (a
    plugin's own namespace, or a stand-in GenerateState without a runtime)."""
    if runtime is not None and runtime.args is args:
        return runtime.config
    return RolloutRunConfig.from_args(completed(args))


def reread_config(args: Any) -> RolloutRunConfig:
    """`args`' config read now, where a rollout or an eval set starts (its caller may have changed the namespace
    since the last one); the bound runtime that holds `args` keeps it, so the rollout's groups read the same."""
    config = RolloutRunConfig.from_args(completed(args))
    runtime = bound()
    if runtime is not None and runtime.args is args:
        runtime.reading(config)
    return config


def unbind(runtime: RolloutRuntime | None = None) -> None:
    """Drop the binding (only if it is `runtime`, when given). A runtime the binding owned is closed
    with it; any other stays its creator's to close."""
    if runtime is None or _bound.get(os.getpid()) is runtime:
        dropped = _bound.pop(os.getpid(), None)
        if dropped is not None and dropped.owned_by_binding:
            dropped.close()


# Views over the bound runtime's tool sets, for code that holds no runtime (slime-style plugins get only `args`).
def get_tool_set(path: str | os.PathLike) -> ToolSet:
    """The tools of a config file, shared by the bound rollout runtime (built on its first use)."""
    return current().tool_sets.get(path)


async def close_tool_sets() -> None:
    """Close and forget the bound runtime's tool sets, on the loop their tools ran on (no runtime bound:
    nothing to close); a later `get_tool_set` builds a fresh one. The runtime also does this when it closes."""
    runtime = bound()
    if runtime is not None:
        await runtime.tool_sets.close()
