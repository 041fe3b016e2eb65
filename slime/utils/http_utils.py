"""slime's HTTP helpers (`from slime.utils.http_utils import post`), for rollout modules written
for slime: a thin compatibility layer over the controller's engine client (its sessions, deadline,
retry counters). Unlike slime's, only transient failures (connection errors, timeouts, 429, 5xx)
are retried, each attempt has a deadline, and a 4xx fails at once with the body in the error.
Outside a controller (a plugin run by hand) each call opens its own session. slime's module-global
httpx client `_http_client` is answered by the bound runtime's `SlimeHttpClient` (see `__getattr__`).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from typing import Any

from slime.utils import http_retry
from slime.utils.generate_traffic import is_generate_url, output_token_count
from slime.utils.endpoints import rollout_num_engines
from slime.utils.misc import is_port_available  # noqa: F401 - slime's path for it, used below too

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 300.0
SLIME_HOST_IP_ENV = "SLIME_HOST_IP"  # slime's override of the address this host advertises


def _client() -> Any:
    """The bound rollout runtime's client, if this process has one. This module is a shim at slime's
    public path, so it reaches up to the rollout layer, lazily and read-only (it never creates one)."""
    from slime.rollout.runtime import bound

    rt = bound()
    return rt.client if rt is not None else None


async def post(
    url: str,
    payload: Any,
    max_retries: int = 60,
    headers: dict[str, str] | None = None,
    *,
    timeout: float | None = None,
) -> Any:
    """slime's `post`. Inside a controller, a `/generate` call counts as engine traffic: it waits for
    the client's in-flight bound (`--sglang-server-concurrency`) and feeds the rollout's progress
    (in flight, responses, tokens), exactly as our own generation does."""
    policy = http_retry.RetryPolicy(max_retries=max_retries)
    client = _client()
    if client is None:
        return await http_retry.post(url, payload, timeout=timeout or DEFAULT_TIMEOUT, policy=policy, headers=headers)
    if not is_generate_url(url):
        return await client.post(url, payload, timeout=timeout, policy=policy, headers=headers)
    async with client.semaphore:
        client.in_flight += 1
        try:
            body = await client.post(url, payload, timeout=timeout, policy=policy, headers=headers)
        finally:
            client.in_flight -= 1
    client.progress.on_response(output_token_count(body))
    return body


async def get(url: str, max_retries: int = 5, timeout: float = 60.0) -> Any:
    client = _client()
    policy = http_retry.RetryPolicy(max_retries=max_retries)
    if client is not None:
        return await client.http.get(url, timeout=timeout, policy=policy, stats=client.stats)
    return await http_retry.get(url, timeout=timeout, policy=policy)


get_rollout_num_engines = rollout_num_engines  # slime's name


def init_http_client(args: Any) -> None:
    """slime creates its module-global httpx client here (its RolloutManager calls it). Ours belongs to
    the process's rollout runtime, which our RolloutManager creates at that point; called by hand
    outside one (a plugin run alone), this binds a runtime for `args`, as slime's call makes a client."""
    from slime.rollout.runtime import current

    current(args)


def __getattr__(name: str) -> Any:
    """`_http_client`, slime's module-global `httpx.AsyncClient`, read by slime's plugins
    (`sglang_streaming_rollout` streams `/generate` through it): here the bound rollout runtime's
    `SlimeHttpClient`, None when no runtime is bound (as slime's before `init_http_client`). A module
    attribute computed on each read, because this package keeps no module-level mutable state."""
    if name == "_http_client":
        from slime.rollout.runtime import bound

        rt = bound()
        return rt.slime_http if rt is not None else None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def find_available_port(base_port: int) -> int:
    """The first free port above `base_port` (slime starts at a random offset; ours is deterministic)."""
    port = base_port + 1
    while not is_port_available(port):
        port += 1
        if port > 65535:
            raise OSError(f"find_available_port: no free port above {base_port}")
    return port


def get_host_info() -> tuple[str, str]:
    """`(hostname, address)` this host advertises to others: `$SLIME_HOST_IP` when set, else 127.0.0.1.
    slime probes the LAN address; ours runs on one machine and binds loopback by default, so it
    advertises loopback unless told otherwise."""
    return socket.gethostname(), os.environ.get(SLIME_HOST_IP_ENV) or "127.0.0.1"


def _wrap_ipv6(host: str) -> str:
    """`[::1]` for an IPv6 address (URLs need the brackets), anything else unchanged."""
    try:
        ipaddress.IPv6Address(host.strip("[]"))
    except ipaddress.AddressValueError:
        return host
    return f"[{host.strip('[]')}]"


def run_router(args: Any) -> int:
    """slime's: launch the real sglang-router with `args` (its RouterArgs); 0 when it ran, 1 when not."""
    try:
        from sglang_router.launch_router import launch_router

        return 0 if launch_router(args) is not None else 1
    except Exception as e:  # noqa: BLE001 - slime's contract is an exit code; the reason is logged
        logger.warning("run_router: %s: %s", type(e).__name__, e)
        return 1


def terminate_process(process: Any, timeout: float = 1.0) -> None:
    """Stop a `multiprocessing.Process`: terminate, wait `timeout` seconds, then kill."""
    if not process.is_alive():
        return
    process.terminate()
    process.join(timeout=timeout)
    if process.is_alive():
        process.kill()
        process.join()
