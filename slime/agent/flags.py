"""Command-line flags of the agent gateway and its rollout function (`slime.agent.rollout`).

The core parser calls `add_agent_arguments(parser)`; `agent_defaults()` gives the same defaults
for code that builds an `argparse.Namespace` by hand; `check_agent_args(args)` refuses bad values
before anything starts. Read only in `GatewayConfig.from_args`, `AgentRun.from_args`,
`CommandAgentConfig.from_args` and `sandbox_pool.pool_from_args`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

AGENT_GENERATE = "slime.agent.rollout.generate"


def add_agent_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    g = parser.add_argument_group("agent gateway")
    g.add_argument("--agent-entry", type=str, default=None,
                   help="package.module.function run once per sample as the agent (sync or async), called with "
                        "base_url=, api_key=, sample=; it talks to the gateway with any OpenAI/Anthropic client "
                        "and returns the reward (None: the reward model scores each branch).")
    g.add_argument("--agent-command", type=str, default=None,
                   help="Shell command run once per sample inside a sandbox session, in a workspace seeded from "
                        "the sample's metadata (files, git); OPENAI_BASE_URL / ANTHROPIC_BASE_URL point at the "
                        "gateway, the API keys are the session key, SLIME_AGENT_PROMPT holds the prompt. "
                        "{python} stands for this Python (its environment is visible read-only). The reward "
                        "comes from the grading command. Exclusive with --agent-entry.")
    g.add_argument("--agent-grade-command", type=str, default=None,
                   help="Shell command that grades the agent's workspace in a fresh sandbox session (exit 0: "
                        "reward 1, else 0), for samples without metadata.grade_command; neither: the reward "
                        "model scores each branch.")
    g.add_argument("--agent-grade-timeout", type=float, default=600.0,
                   help="Seconds the grading command may take.")
    g.add_argument("--agent-sandbox-url", type=str, default="local",
                   help="The slime-sandbox server agent commands run in; 'local' starts one for the run, with "
                        "the gateway as its sessions' one egress.")
    g.add_argument("--agent-sandbox-concurrency", type=int, default=8,
                   help="Sandbox sessions open at once across the cluster (agent runs and gradings).")
    g.add_argument("--agent-sandbox-ro-path", action="append", default=[],
                   help="Host path visible read-only in the local sandbox's sessions (repeatable), e.g. the "
                        "agent's script.")
    g.add_argument("--agent-api", choices=("openai", "anthropic"), default="openai",
                   help="Which base_url the agent gets: OpenAI's (.../v1) or Anthropic's.")
    g.add_argument("--agent-timeout", type=float, default=1800.0,
                   help="Seconds one agent run may take; the turns it made until then still train.")
    g.add_argument("--agent-max-turns", type=int, default=None,
                   help="Turns one session may take; the next is answered 429 in the client's API format.")
    g.add_argument("--agent-fork-threshold", type=int, default=None,
                   help="Response tokens from which a rewritten or drifted answer keeps its own branch "
                        "(TrajectoryManager's 1024 when unset; 0: always fork). The gateway never absorbs an "
                        "answer it trains, whatever its length: there it only bounds realigning context.")
    g.add_argument("--agent-gateway-port", type=int, default=0,
                   help="Port of the gateway (127.0.0.1); 0 picks a free one.")
    return parser


def agent_defaults() -> dict[str, Any]:
    return vars(add_agent_arguments(argparse.ArgumentParser()).parse_args([]))


def check_agent_args(args: Any) -> None:
    """ValueError naming the flag, when the agent rollout (`--custom-generate-function-path
    slime.agent.rollout.generate`) is asked for with flags it cannot run with."""
    if getattr(args, "custom_generate_function_path", None) == AGENT_GENERATE:
        check_agent_run(args)


def check_agent_run(args: Any) -> None:
    """What one agent run needs of the flags (ValueError naming the flag)."""
    if bool(args.agent_entry) == bool(args.agent_command):
        raise ValueError(f"--custom-generate-function-path {AGENT_GENERATE} needs exactly one of --agent-entry "
                         "package.module.function (an agent on the host) and --agent-command '...' (an agent "
                         "command in a sandbox session)")
    for flag in ("agent_timeout", "agent_grade_timeout"):
        if getattr(args, flag) <= 0:
            raise ValueError(f"--{flag.replace('_', '-')}: must be > 0 seconds, got {getattr(args, flag)}")
    if args.agent_sandbox_concurrency < 1:
        raise ValueError(f"--agent-sandbox-concurrency: must be >= 1, got {args.agent_sandbox_concurrency}")
    for path in args.agent_sandbox_ro_path:
        if not os.path.exists(path):
            raise ValueError(f"--agent-sandbox-ro-path {path}: no such file or directory")
