"""`SandboxPool`: the sandbox sessions agent runs open, under one cluster-wide concurrency cap.

Each `session()` holds one permit of the limiter `agent:sandbox` (a Ray actor when Ray runs, as the
sandbox tool's limiter is; else one per event loop) for the whole life of the session, and the
session is closed on every exit path. `opener(egress)` builds an unopened `Sandbox`; `egress` is
the name of the one way out the session may have (the gateway), or None for none (grading).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

from slime.agent.sandboxes.sandbox import Sandbox
from slime.tools.rate_limiter import (
    RateLimiter,
    RateLimiterUnavailable,
    client_for,
    get_or_create_rate_limiter,
    local_rate_limiter,
)

logger = logging.getLogger(__name__)
LIMITER_NAME = "agent:sandbox"
EGRESS = "gateway"  # the name the sandbox server knows the gateway by

SandboxOpener = Callable[[str | None], Sandbox]


class SandboxPool:
    def __init__(
        self,
        opener: SandboxOpener,
        *,
        concurrency: int,
        acquire_timeout: float = 600.0,
        limiter_name: str = LIMITER_NAME,
        cluster_wide: bool | None = None,
    ) -> None:
        """`cluster_wide`: one Ray limiter for every process (None: when Ray is initialised)."""
        if concurrency < 1:
            raise ValueError(f"--agent-sandbox-concurrency must be >= 1, got {concurrency}")
        self.opener, self.concurrency, self.acquire_timeout = opener, concurrency, acquire_timeout
        self.limiter_name = limiter_name
        self._handle = self._global_handle() if cluster_wide is not False else None
        self._local: dict[int, RateLimiter] = {}

    def _global_handle(self):
        import ray

        if not ray.is_initialized():
            return None
        return get_or_create_rate_limiter(self.limiter_name, self.concurrency)

    def _limiter(self) -> RateLimiter:
        if self._handle is not None:
            try:
                return client_for(self.limiter_name, self._handle)
            except RateLimiterUnavailable as e:
                logger.error("%s: cluster-wide limiter unavailable (%s); limiting per process", self.limiter_name, e)
                self._handle = None
        loop = id(asyncio.get_running_loop())
        if loop not in self._local:
            self._local[loop] = local_rate_limiter(self.concurrency, name=self.limiter_name)
        return self._local[loop]

    @contextlib.asynccontextmanager
    async def session(self, *, egress: str | None) -> AsyncIterator[Sandbox]:
        """An open sandbox session; waits for a permit (`RateLimitTimeout` after `acquire_timeout`)."""
        limiter = self._limiter()
        await limiter.acquire(timeout=self.acquire_timeout)
        try:
            async with self.opener(egress) as sb:
                yield sb
        finally:
            limiter.release()


def pool_of(config: Any, *, gateway_port: int, on_close: Callable[[Callable[[], Any]], None]) -> SandboxPool:
    """The pool of `--agent-sandbox-url` (`config`: the agent flags, `slime.agent.flags.AgentConfig`; 'local': a
    sandbox server started here, whose sessions' one egress is the gateway on 127.0.0.1:`gateway_port`, stopped
    through `on_close`)."""
    from slime.agent.sandboxes.sandbox_slime import SlimeSandbox

    url = config.agent_sandbox_url
    if url == "local":
        url = start_local_server(config, gateway_port=gateway_port, on_close=on_close)
    return SandboxPool(lambda egress: SlimeSandbox(url, egress=egress), concurrency=config.agent_sandbox_concurrency)


def start_local_server(config: Any, *, gateway_port: int, on_close: Callable[[Callable[[], Any]], None]) -> str:
    """A sandbox server for this run: `--agent-sandbox-ro-path`s visible read-only, and this Python's
    environment too when `--agent-command` uses {python}."""
    from slime.sandbox.server import start_local_sandbox

    ro = list(config.agent_sandbox_ro_path)
    if "{python}" in (config.agent_command or ""):
        ro += sorted({sys.prefix, sys.base_prefix})
    extra = ["--egress", f"{EGRESS}=127.0.0.1:{gateway_port}"]
    for path in ro:
        extra += ["--ro-bind", path]
    url, handle = start_local_sandbox(max_concurrency=config.agent_sandbox_concurrency, extra_args=extra)
    on_close(handle.stop)
    return url
