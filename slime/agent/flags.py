"""Command-line flags of the agent gateway and its rollout function (`slime.agent.rollout`).

The flags are `AgentConfig`'s fields; the core parser calls `add_agent_arguments(parser)`; `agent_defaults()` gives
the same defaults for code that builds an `argparse.Namespace` by hand. The agent rollout reads the namespace once
into `AgentRolloutConfig` (its flags and the core parser's three it uses) and hands that down: the gateway gets a
`GatewayConfig`, the command agent a `CommandAgentConfig`, the sandbox pool the `AgentConfig`; nothing below reads
`args`. `check_agent_args(args)` refuses bad values before anything starts.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

from slime.utils.flag_config import FlagConfig, ParsedConfig, flag

AGENT_GENERATE = "slime.agent.rollout.generate"


@dataclass(frozen=True)
class AgentConfig(FlagConfig):
    GROUP = "agent gateway"

    agent_entry: str | None = flag(
        None,
        type=str,
        help="package.module.function run once per sample as the agent (sync or async), called with "
        "base_url=, api_key=, sample=; it talks to the gateway with any OpenAI/Anthropic client "
        "and returns the reward (None: the reward model scores each branch).",
    )
    agent_command: str | None = flag(
        None,
        type=str,
        help="Shell command run once per sample inside a sandbox session, in a workspace seeded from "
        "the sample's metadata (files, git); OPENAI_BASE_URL / ANTHROPIC_BASE_URL point at the "
        "gateway, the API keys are the session key, SLIME_AGENT_PROMPT holds the prompt. "
        "{python} stands for this Python (its environment is visible read-only). The reward "
        "comes from the grading command. Exclusive with --agent-entry.",
    )
    agent_grade_command: str | None = flag(
        None,
        type=str,
        help="Shell command that grades the agent's workspace in a fresh sandbox session (exit 0: "
        "reward 1, else 0), for samples without metadata.grade_command; neither: the reward "
        "model scores each branch.",
    )
    agent_grade_timeout: float = flag(600.0, type=float, help="Seconds the grading command may take.")
    agent_sandbox_url: str = flag(
        "local",
        type=str,
        help="The slime-sandbox server agent commands run in; 'local' starts one for the run, with "
        "the gateway as its sessions' one egress.",
    )
    agent_sandbox_concurrency: int = flag(
        8, type=int, help="Sandbox sessions open at once across the cluster (agent runs and gradings)."
    )
    agent_sandbox_ro_path: list[str] = flag(
        [],
        action="append",
        help="Host path visible read-only in the local sandbox's sessions (repeatable), e.g. the agent's script.",
    )
    agent_api: str = flag(
        "openai",
        choices=("openai", "anthropic"),
        help="Which base_url the agent gets: OpenAI's (.../v1) or Anthropic's.",
    )
    agent_timeout: float = flag(
        1800.0, type=float, help="Seconds one agent run may take; the turns it made until then still train."
    )
    agent_max_turns: int | None = flag(
        None, type=int, help="Turns one session may take; the next is answered 429 in the client's API format."
    )
    agent_fork_threshold: int | None = flag(
        None,
        type=int,
        help="Response tokens from which a rewritten or drifted answer keeps its own branch "
        "(TrajectoryManager's 1024 when unset; 0: always fork). The gateway never absorbs an "
        "answer it trains, whatever its length: there it only bounds realigning context.",
    )
    agent_gateway_port: int = flag(0, type=int, help="Port of the gateway (127.0.0.1); 0 picks a free one.")


@dataclass(frozen=True)
class AgentRolloutConfig(ParsedConfig):
    """What the agent rollout reads, once, from the namespace: its own flags, and the core parser's rollout
    function (is it the agent's?), tool-call parser and context bound (the gateway's)."""

    agent: AgentConfig
    custom_generate_function_path: str | None
    tool_call_parser: str | None
    rollout_max_context_len: int | None


def add_agent_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    return AgentConfig.add_arguments(parser)


def agent_defaults() -> dict[str, Any]:
    return AgentConfig.defaults()


def check_agent_args(args: Any) -> None:
    """ValueError naming the flag, when the agent rollout (`--custom-generate-function-path
    slime.agent.rollout.generate`) is asked for with flags it cannot run with."""
    config = AgentRolloutConfig.from_args(args)
    if config.custom_generate_function_path == AGENT_GENERATE:
        check_agent_run(config.agent)


def check_agent_run(config: AgentConfig) -> None:
    """What one agent run needs of the flags (ValueError naming the flag)."""
    if bool(config.agent_entry) == bool(config.agent_command):
        raise ValueError(
            f"--custom-generate-function-path {AGENT_GENERATE} needs exactly one of --agent-entry "
            "package.module.function (an agent on the host) and --agent-command '...' (an agent "
            "command in a sandbox session)"
        )
    for dest in ("agent_timeout", "agent_grade_timeout"):
        if getattr(config, dest) <= 0:
            raise ValueError(f"--{dest.replace('_', '-')}: must be > 0 seconds, got {getattr(config, dest)}")
    if config.agent_sandbox_concurrency < 1:
        raise ValueError(f"--agent-sandbox-concurrency: must be >= 1, got {config.agent_sandbox_concurrency}")
    for path in config.agent_sandbox_ro_path:
        if not os.path.exists(path):
            raise ValueError(f"--agent-sandbox-ro-path {path}: no such file or directory")
