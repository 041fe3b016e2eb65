"""Command-line flags of the agent gateway and its rollout function (`slime.agent.rollout`).

The core parser calls `add_agent_arguments(parser)`; `agent_defaults()` gives the same defaults
for code that builds an `argparse.Namespace` by hand. Read only in `GatewayConfig.from_args` and
`AgentRun.from_args`.
"""

from __future__ import annotations

import argparse
from typing import Any


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
                        "(TrajectoryManager's 1024 when unset; 0: always fork).")
    g.add_argument("--agent-gateway-port", type=int, default=0,
                   help="Port of the gateway (127.0.0.1); 0 picks a free one.")
    return parser


def agent_defaults() -> dict[str, Any]:
    return vars(add_agent_arguments(argparse.ArgumentParser()).parse_args([]))
