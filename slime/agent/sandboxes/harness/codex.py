"""Codex (`codex exec`) against the gateway's OpenAI endpoint.

The provider's base_url must be written into config.toml (Codex reads env vars only for its
default OpenAI provider); the file goes through base64 so no shell quoting can break it.
"""

from __future__ import annotations

import base64
import shlex

from slime.agent.sandboxes.sandbox import Sandbox

from .common import BaseHarness, HarnessContext, cli_present, give_to_agent, install_npm_cli, run_agent

CONFIG_TOML = """model = "{model}"
model_provider = "slime"

[model_providers.slime]
name = "slime"
base_url = "{base_url}"
env_key = "OPENAI_API_KEY"
wire_api = "{wire_api}"
"""


class CodexHarness(BaseHarness):
    name = "codex"
    env_prefix = "CODEX"
    exec_flags = "--skip-git-repo-check"  # shallow or odd checkouts must not stop it
    wire_api = "chat"  # slime's choice; Codex 0.169 refuses it: HarnessConfig(wire_api="responses")

    async def install_cli(self, sb: Sandbox) -> None:
        if await cli_present(sb, "codex --version"):
            return
        node, cli = self.tarballs()
        await install_npm_cli(sb, node_runtime=node, npm_package=cli, check_cmd="codex --version")

    async def write_config(self, sb: Sandbox, ctx: HarnessContext) -> None:
        toml = CONFIG_TOML.format(
            model=ctx.model_label, base_url=f"{ctx.adapter_url}/v1", wire_api=self.config.wire_api or self.wire_api
        )
        b64 = base64.b64encode(toml.encode()).decode("ascii")
        await sb.exec(
            f"mkdir -p /home/agent/.codex && echo {shlex.quote(b64)} | base64 -d > "
            f"/home/agent/.codex/config.toml{give_to_agent(sb, '/home/agent/.codex')}",
            user="root",
            check=True,
            timeout=60,
        )

    async def launch_and_wait(self, sb: Sandbox, ctx: HarnessContext, prompt: str, time_budget_sec: int) -> int:
        cmd = " ".join(filter(None, [f"codex exec {self.exec_flags} {shlex.quote(prompt)}", self.config.extra_args]))
        # Codex sends OPENAI_API_KEY as the bearer token: the session's key, its only credential
        env = {"OPENAI_API_KEY": ctx.session_id, "OPENAI_BASE_URL": f"{ctx.adapter_url}/v1", **self.config.extra_env}
        return await run_agent(sb, workdir=ctx.workdir, start_cmd=cmd, env=env, time_budget_sec=time_budget_sec)
