"""Command-line flags of the multi-turn tool loop, as one frozen config (`ToolConfig`).

Kept apart from the core parser so the tool system can be used (and tested) on its own; the core
calls `add_tool_arguments(parser)` (generated from the fields). `tool_defaults()` gives the same
defaults for code that builds an `argparse.Namespace` by hand.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from slime.utils.flag_config import AT_LEAST_ONE, POSITIVE, FlagConfig, flag

# defaults of the per-call tool limits, also `ToolCallLimits`'s (a namespace built by hand gets the same)
MAX_PARALLEL_CALLS = 4
MAX_TOOL_RESPONSE_TOKENS = 512
TOOL_RESPONSE_TRUNCATE_SIDE = "middle"
INTERACTIONS = "multi-turn interactions (verl's simulated user)"


@dataclass(frozen=True)
class ToolConfig(FlagConfig):
    GROUP = "multi-turn tools"

    tool_config_path: str | None = flag(
        None, type=str, help="verl-format tool YAML (tools: [{class_name, config, tool_schema}])."
    )
    tool_call_parser: str = flag(
        "hermes", type=str, help="How tool calls are read from model output (see slime.tools.chat_format.PARSERS)."
    )
    max_turns: int = flag(8, type=int, range=AT_LEAST_ONE, help="Assistant turns per trajectory.")
    max_parallel_calls: int = flag(
        MAX_PARALLEL_CALLS,
        type=int,
        help="Tool calls executed per turn; extra calls are answered with an error message.",
    )
    max_tool_response_tokens: int = flag(
        MAX_TOOL_RESPONSE_TOKENS,
        type=int,
        help="Each tool result is cut to this many tokens before it is rendered (0: no limit).",
    )
    tool_response_truncate_side: str = flag(
        TOOL_RESPONSE_TRUNCATE_SIDE,
        choices=("left", "right", "middle"),
        help="verl's meaning: left keeps the beginning, right keeps the end, middle keeps both ends.",
    )
    max_tokens_per_turn: int | None = flag(
        None, type=int, help="Cap on max_new_tokens of one assistant turn (default: no cap beyond the budgets)."
    )
    tool_call_timeout: float | None = flag(
        None,
        type=float,
        range=POSITIVE,
        help="Seconds one tool call may run before it is answered with a timeout error.",
    )
    tool_reward_mode: str = flag(
        "none", choices=("none", "add"), help="add: reward = outcome reward + step rewards + final tool rewards."
    )
    chat_template_check: str = flag(
        "error",
        choices=("error", "warn", "off"),
        help="Start-up check that the chat template is append-only for tool turns, and a "
        "per-sample drift check; error refuses to start when the template drifts.",
    )
    interaction_config_path: str | None = flag(
        None,
        type=str,
        group=INTERACTIONS,
        help="verl-format interaction YAML (interaction: [{name, class_name, config}]): after an "
        "assistant turn without tool calls, the sample's interaction answers as the user.",
    )
    interaction_key: str = flag(
        "extra_info.interaction_kwargs",
        type=str,
        group=INTERACTIONS,
        help="Row field holding verl's interaction_kwargs (its 'name' picks the interaction; "
        "all of it goes to start_interaction and generate_response).",
    )
    interaction_timeout: float = flag(
        300.0,
        type=float,
        range=POSITIVE,
        group=INTERACTIONS,
        help="Seconds each start_interaction / generate_response / finalize_interaction "
        "call may take; one that does not return fails its sample, named, and the "
        "rollout goes on.",
    )
    max_user_turns: int | None = flag(
        None,
        type=int,
        group=INTERACTIONS,
        help="User turns an interaction may add to one trajectory (default: no limit "
        "beyond --max-turns and the budgets).",
    )


def add_tool_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    return ToolConfig.add_arguments(parser)


def tool_defaults() -> dict[str, Any]:
    """The flag defaults as a dict (for tests and scripts that build a Namespace)."""
    return ToolConfig.defaults()
