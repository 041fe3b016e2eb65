"""The agent rollout reads its flags once into `AgentRolloutConfig` (issue #33) and hands its parts down: the
gateway gets a `GatewayConfig`, the command agent a `CommandAgentConfig`, the sandbox pool the `AgentConfig`.
Only `generate`, the plugin slime calls, receives `args`; nothing in `slime.agent` reads a flag off it."""

from __future__ import annotations

import sys

from slime.agent.flags import AgentConfig, AgentRolloutConfig
from slime.agent.gateway.server import GatewayConfig
from slime.agent.sandboxes.command_agent import CommandAgentConfig
from slime.cli.parser import build_parser
from tests.args_reads import flag_reads

DESTS = {a.dest for a in build_parser()._actions if a.option_strings}  # noqa: SLF001


def test_the_rollout_config_of_an_empty_command_line_is_the_defaults():
    config = AgentRolloutConfig.from_args(build_parser().parse_args([]))
    assert config == AgentRolloutConfig(
        agent=AgentConfig(), custom_generate_function_path=None, tool_call_parser="hermes", rollout_max_context_len=None
    )
    assert GatewayConfig.of(config) == GatewayConfig()


def test_the_flags_given_reach_the_gateway_and_the_command_agent():
    argv = [
        "--agent-command",
        "{python} a.py",
        "--agent-grade-timeout",
        "7",
        "--agent-max-turns",
        "3",
        "--agent-fork-threshold",
        "0",
        "--agent-gateway-port",
        "9",
        "--tool-call-parser",
        "qwen25",
        "--rollout-max-context-len",
        "512",
    ]
    config = AgentRolloutConfig.from_args(build_parser().parse_args(argv))
    assert GatewayConfig.of(config) == GatewayConfig(
        port=9, tool_parser="qwen25", max_turns=3, fork_threshold_tokens=0, max_context_tokens=512
    )
    assert CommandAgentConfig.of(config.agent) == CommandAgentConfig(
        command=f"{sys.executable} a.py", timeout=1800.0, grade_command=None, grade_timeout=7.0
    )


def test_the_agent_package_reads_no_flag_from_args():
    """rollout.py reads the namespace into AgentRolloutConfig/AgentConfig (before: 24 reads of 22 flags in flags.py,
    rollout.py, gateway/server.py, sandboxes/command_agent.py and sandboxes/sandbox_pool.py)."""
    assert flag_reads("slime/agent", DESTS) == {}
