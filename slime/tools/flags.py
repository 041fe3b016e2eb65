"""Command-line flags of the multi-turn tool loop.

Kept apart from the core parser so the tool system can be used (and tested) on its own; the core
calls `add_tool_arguments(parser)`. `tool_defaults()` gives the same defaults for code that builds
an `argparse.Namespace` by hand.
"""

from __future__ import annotations

import argparse
from typing import Any

# defaults of the per-call tool limits, also `ToolCallLimits`'s (a namespace built by hand gets the same)
MAX_PARALLEL_CALLS = 4
MAX_TOOL_RESPONSE_TOKENS = 512
TOOL_RESPONSE_TRUNCATE_SIDE = "middle"


def add_tool_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    g = parser.add_argument_group("multi-turn tools")
    g.add_argument("--tool-config-path", type=str, default=None,
                   help="verl-format tool YAML (tools: [{class_name, config, tool_schema}]).")
    g.add_argument("--tool-call-parser", type=str, default="hermes",
                   help="How tool calls are read from model output (see slime.tools.chat_format.PARSERS).")
    g.add_argument("--max-turns", type=int, default=8, help="Assistant turns per trajectory.")
    g.add_argument("--max-parallel-calls", type=int, default=MAX_PARALLEL_CALLS,
                   help="Tool calls executed per turn; extra calls are answered with an error message.")
    g.add_argument("--max-tool-response-tokens", type=int, default=MAX_TOOL_RESPONSE_TOKENS,
                   help="Each tool result is cut to this many tokens before it is rendered (0: no limit).")
    g.add_argument("--tool-response-truncate-side", choices=("left", "right", "middle"),
                   default=TOOL_RESPONSE_TRUNCATE_SIDE,
                   help="verl's meaning: left keeps the beginning, right keeps the end, middle keeps both ends.")
    g.add_argument("--max-tokens-per-turn", type=int, default=None,
                   help="Cap on max_new_tokens of one assistant turn (default: no cap beyond the budgets).")
    g.add_argument("--tool-call-timeout", type=float, default=None,
                   help="Seconds one tool call may run before it is answered with a timeout error.")
    g.add_argument("--tool-reward-mode", choices=("none", "add"), default="none",
                   help="add: reward = outcome reward + step rewards + final tool rewards.")
    g.add_argument("--chat-template-check", choices=("error", "warn", "off"), default="error",
                   help="Start-up check that the chat template is append-only for tool turns, and a "
                        "per-sample drift check; error refuses to start when the template drifts.")
    g = parser.add_argument_group("multi-turn interactions (verl's simulated user)")
    g.add_argument("--interaction-config-path", type=str, default=None,
                   help="verl-format interaction YAML (interaction: [{name, class_name, config}]): after an "
                        "assistant turn without tool calls, the sample's interaction answers as the user.")
    g.add_argument("--interaction-key", type=str, default="extra_info.interaction_kwargs",
                   help="Row field holding verl's interaction_kwargs (its 'name' picks the interaction; all of "
                        "it goes to start_interaction and generate_response).")
    g.add_argument("--interaction-timeout", type=float, default=300.0,
                   help="Seconds each start_interaction / generate_response / finalize_interaction call may take; "
                        "one that does not return fails its sample, named, and the rollout goes on.")
    g.add_argument("--max-user-turns", type=int, default=None,
                   help="User turns an interaction may add to one trajectory (default: no limit beyond "
                        "--max-turns and the budgets).")
    return parser


def tool_defaults() -> dict[str, Any]:
    """The flag defaults as a dict (for tests and scripts that build a Namespace)."""
    return vars(add_tool_arguments(argparse.ArgumentParser()).parse_args([]))


def flag_value(args: Any, name: str, default: Any = None) -> Any:
    """`args.<name>`, or `default` when it is missing or None (a Namespace built by hand may lack it)."""
    value = getattr(args, name, None)
    return default if value is None else value
