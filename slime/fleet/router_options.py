"""sglang-router's own `--router-*` options, from the user's command line to the router slime starts.

The parser registers every option of sglang-router (as slime does, `--router-` prefixed), so a run script that
tunes its router moves over unchanged. Each one the user set (or slime's own overrides of the router's defaults)
goes on `launch_router`'s command line under its own name, after slime's options, so the user's value wins. A few
are never passed because slime's guarantees depend on them (`NOT_PASSED`): the start-up notice names those.
"""

from __future__ import annotations

import argparse
from typing import Any

# dest -> why slime does not pass it to the router it starts
NOT_PASSED = {
    "worker_urls": "slime registers its own engines with the router",
    "router_prometheus_host": "the router's metrics listen on 127.0.0.1 only",
    "router_retry_max_retries": "the router's retries stay off: every retry is the engine client's, counted",
    "router_retry_initial_backoff_ms": "the router's retries stay off: every retry is the engine client's, counted",
    "router_retry_max_backoff_ms": "the router's retries stay off: every retry is the engine client's, counted",
    "router_retry_backoff_multiplier": "the router's retries stay off: every retry is the engine client's, counted",
    "router_retry_jitter_factor": "the router's retries stay off: every retry is the engine client's, counted",
}

# router options slime's own flags set (--router-policy, --router-prometheus-port) or `Router.command` always gives
SLIME_SETS = frozenset({"router_policy", "router_prometheus_port", "router_disable_retries"})


def router_option_actions() -> list[argparse.Action]:
    """sglang-router's options as its own parser defines them, `--router-` prefixed; [] without the package."""
    try:
        from sglang_router.router_args import RouterArgs
    except ImportError:
        return []
    scratch = argparse.ArgumentParser(add_help=False)
    RouterArgs.add_cli_args(scratch, use_router_prefix=True, exclude_host_port=True)
    return [a for a in scratch._actions if a.option_strings]  # noqa: SLF001


def router_policies() -> list[str] | None:
    """The load-balancing policies this sglang-router offers (None without the package)."""
    for action in router_option_actions():
        if action.dest == "router_policy":
            return list(action.choices)
    return None


def _launch_name(action: argparse.Action) -> str:
    """`--router-cache-threshold` -> `--cache-threshold`: launch_router's own spelling."""
    flag = action.option_strings[0]
    return "--" + flag.removeprefix("--").removeprefix("router-")


def _render(action: argparse.Action, value: Any) -> list[str]:
    name = _launch_name(action)
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):  # noqa: SLF001
        return [name]
    if isinstance(value, dict):
        return [name, *(f"{k}={v}" for k, v in value.items())]
    if isinstance(action, argparse._AppendAction):  # noqa: SLF001 - one occurrence per appended item
        return [part for item in value for part in (name, *map(str, item if isinstance(item, list) else [item]))]
    if isinstance(value, (list, tuple)):
        return [name, *map(str, value)]
    return [name, str(value)]


def router_passthrough(args: Any, taken: set[str] = frozenset()) -> list[str]:
    """launch_router options for every router option whose value on `args` differs from sglang-router's own
    default, except `NOT_PASSED` and the dests in `taken` (slime's own flags for the same setting)."""
    out: list[str] = []
    for action in router_option_actions():
        if action.dest in NOT_PASSED or action.dest in taken or not hasattr(args, action.dest):
            continue
        value = getattr(args, action.dest)
        if value is None or value == action.default or value == []:
            continue
        out += _render(action, value)
    return out


def not_passed(args: Any) -> list[str]:
    """The `NOT_PASSED` options the user set, as flags (for the start-up notice)."""
    return [
        a.option_strings[0]
        for a in router_option_actions()
        if a.dest in NOT_PASSED and hasattr(args, a.dest) and getattr(args, a.dest) not in (None, a.default, [])
    ]
