"""A `RolloutRuntime` for tests and benchmarks that drive rollout functions without a manager."""

from __future__ import annotations

from typing import Any

from slime.rollout.engine_client import EngineClient
from slime.rollout.runtime import RolloutRuntime
from slime.tools.services import ToolServices
from slime.utils.endpoints import Endpoints
from slime.utils.plugin_args import completed


def bind_runtime(
    args: Any, *, tokenizer: Any = None, engine_urls: list[str] | None = None, tool_services: ToolServices | None = None
) -> RolloutRuntime:
    """Bind a fresh runtime for `args` (router at --sglang-router-ip/--sglang-router-port), owned by
    the binding: `unbind()` (or binding another) closes it, its HTTP sessions and `on_close` servers."""
    args = completed(args)  # a test's namespace, built by hand: the parser's defaults for the rest
    router = f"http://{args.sglang_router_ip}:{args.sglang_router_port}" if args.sglang_router_ip else None
    client = EngineClient.from_args(args, Endpoints(router, list(engine_urls or [])), tokenizer=tokenizer)
    return RolloutRuntime(args, client, tool_services or ToolServices(), owned_by_binding=True).bind()
