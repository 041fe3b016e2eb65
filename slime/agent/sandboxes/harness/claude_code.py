"""Claude Code (`claude -p`) against the gateway's Anthropic Messages endpoint."""

from __future__ import annotations

import json
import shlex

from slime.agent.sandboxes.sandbox import Sandbox

from .common import BaseHarness, HarnessContext, cli_present, give_to_agent, install_npm_cli, run_agent


class ClaudeCodeHarness(BaseHarness):
    """`claude` is looked up on PATH, as Codex's harness does: on an E2B image that finds
    `/usr/local/bin/claude` (where `install_npm_cli` puts it); our sandbox's `/usr` is the host's,
    read-only, so there it is the npm package bound read-only, its `node_modules/.bin` on PATH."""

    name = "claude_code"
    env_prefix = "CC"
    launch_flags = (
        "--permission-mode bypassPermissions --output-format stream-json --include-partial-messages "
        "--include-hook-events --verbose"
    )
    # no telemetry or update checks (offline), no experimental betas, no attribution header
    static_env = {
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1",
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
    }

    async def install_cli(self, sb: Sandbox) -> None:
        if await cli_present(sb, "claude --version"):
            return
        node, cli = self.tarballs()
        await install_npm_cli(
            sb,
            node_runtime=node,
            npm_package=cli,
            check_cmd="ls -la /usr/local/bin/claude && /usr/local/bin/claude --version",
        )

    async def write_config(self, sb: Sandbox, ctx: HarnessContext) -> None:
        """Onboarding done and bypass-permissions accepted, so it starts headless."""
        settings = json.dumps({"hasCompletedOnboarding": True, "bypassPermissionsModeAccepted": True})
        await sb.exec(
            f"mkdir -p /home/agent/.claude && echo {shlex.quote(settings)} "
            "| tee /home/agent/.claude.json /home/agent/.claude/settings.json > /dev/null"
            + give_to_agent(sb, "/home/agent/.claude /home/agent/.claude.json"),
            user="root",
            check=True,
            timeout=60,
        )

    async def launch_and_wait(self, sb: Sandbox, ctx: HarnessContext, prompt: str, time_budget_sec: int) -> int:
        cmd = " ".join(filter(None, [f"claude -p {shlex.quote(prompt)}", self.launch_flags, self.config.extra_args]))
        # the session's key travels as the API key (Authorization): the agent's only credential
        env = {
            "ANTHROPIC_BASE_URL": ctx.adapter_url,
            "ANTHROPIC_AUTH_TOKEN": ctx.session_id,
            "ANTHROPIC_MODEL": ctx.model_label,
            **self.static_env,
            **self.config.extra_env,
        }
        return await run_agent(sb, workdir=ctx.workdir, start_cmd=cmd, env=env, time_budget_sec=time_budget_sec)
