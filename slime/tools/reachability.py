"""Before a run starts: is every remote service a tool config names there?

A tool YAML copied from verl keeps verl's service URLs (a retriever on 127.0.0.1:8000, a
SandboxFusion gateway). Loading it succeeds, but every call would then fail mid-rollout, each
after its retries. `check_services` opens one TCP connection per configured URL (all at once,
bounded by `timeout`) and refuses with the file, the entry, the tool and the field instead.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from slime.tools.base_tool import ToolConfigError

DEFAULT_PORTS = {"http": 80, "https": 443}


def endpoints(tool_set: Any) -> list[tuple[str, str, str]]:
    """(where, field, URL) of every service the tools of `tool_set` call, in config order."""
    out = []
    for name, tool in tool_set.tools.items():
        urls = getattr(tool, "service_urls", None)
        for field, url in (urls() if callable(urls) else {}).items():
            out.append((f"{tool_set.entry_of(name)} ({name!r}).config.{field}", field, url))
    return out


async def _reach(url: str, timeout: float) -> str | None:
    """None when something accepts a connection at the URL's host and port, else why not."""
    parts = urlsplit(url)
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return "not an http(s) URL"
    try:
        port = parts.port or DEFAULT_PORTS[parts.scheme]
    except ValueError as e:
        return str(e)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), timeout)
    except asyncio.TimeoutError:
        return f"no answer from {parts.hostname}:{port} within {timeout:g} s"
    except OSError as e:  # refused, unknown host, unreachable network
        return f"{type(e).__name__}: {e.strerror or e}"
    writer.close()
    return None


async def _reach_all(urls: list[str], timeout: float) -> list[str | None]:
    return await asyncio.gather(*(_reach(u, timeout) for u in urls))


def _run_to_end(urls: list[str], timeout: float) -> list[str | None]:
    """On a loop of its own: in a thread when the caller already runs one (asyncio.run refuses that)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_reach_all(urls, timeout))
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _reach_all(urls, timeout)).result()


def check_services(tool_set: Any, timeout: float = 5.0) -> None:
    """Raise `ToolConfigError` naming the first service that cannot be reached (with how many more)."""
    found = endpoints(tool_set)
    if not found:
        return
    problems = [
        (where, url, why) for (where, _, url), why in zip(found, _run_to_end([u for _, _, u in found], timeout)) if why
    ]
    if problems:
        where, url, why = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ToolConfigError(
            f"{tool_set.source}: {where}: cannot reach {url} ({why}){more}; start the "
            f"service there or change the URL before the run starts"
        )
