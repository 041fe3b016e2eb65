"""Issue 23, stretch: agents nobody here wrote run *inside* a sandbox session whose one way out is the gateway
(`--egress`), each finishing a session whose trajectory is exactly what the engine sampled: the real CLIs
from the npm registry (`tests/test_agent_cli.py` installs them into ~/.cache/slime/agent-clis), bound
read-only into the sandbox (`--ro-bind`) -- Claude Code through Anthropic Messages, Codex through the
Responses API -- and an `openai` SDK script run by this venv's interpreter (venv and base bound read-only)."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from slime.agent.gateway.server import GatewayConfig
from slime.agent.sandboxes.harness.codex import CONFIG_TOML
from slime.testing.agent_stack import AgentStack
from tests.test_agent_cli import (
    CLAUDE_CODE,
    CLI_CACHE,
    CODEX,
    assert_each_request_is_a_token_exact_sample,
    npm_installed,
)
from tests.test_sandbox import ISOLATED

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not ISOLATED, reason="sessions need namespaces/uid switching")]
INSIDE = "/opt/agent-clis"


def _python_trees() -> list[str]:
    """This venv and its base interpreter's prefix, at their own paths (a venv names its base by path;
    one under /usr, /tmp or /home nests below the sandbox's own)."""
    return sorted({os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)})


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from transformers import AutoTokenizer

    from slime.sandbox.server import start_local_sandbox
    from slime.testing.tiny_model import qwen_tokenizer_dir

    claude = npm_installed(CLAUDE_CODE, "@anthropic-ai/claude-code-linux-x64/claude")
    codex = npm_installed(CODEX, "@openai/codex/bin/codex.js")
    tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    stack = AgentStack(
        tok,
        qwen_tokenizer_dir(),
        lambda case, turn: "Done.",
        config=GatewayConfig(),
        log_dir=str(tmp_path_factory.mktemp("router")),
    ).start()
    try:
        url, handle = start_local_sandbox(
            max_concurrency=1,
            extra_args=[
                "--egress",
                f"gateway=127.0.0.1:{stack.gateway.port}",
                "--ro-bind",
                f"{CLI_CACHE}:{INSIDE}",
                *[a for p in _python_trees() for a in ("--ro-bind", p)],
                "--max-processes",
                "512",
            ],
        )
    except BaseException:
        stack.stop()
        raise
    yield {
        "url": url,
        "stack": stack,
        "claude": f"{INSIDE}/{claude.relative_to(CLI_CACHE)}",
        "codex": f"{INSIDE}/{codex.relative_to(CLI_CACHE)}",
    }
    handle.stop()
    stack.stop()


def test_claude_code_runs_inside_a_session_with_the_gateway_as_its_only_way_out(env):
    from slime.agent.sandboxes.sandbox_slime import SlimeSandbox

    env["stack"].gateway.open_session("ccs-1")
    path = env["stack"].gateway.session_path("ccs-1")

    async def agent():
        async with SlimeSandbox(env["url"], egress="gateway", memory_mb=4096) as sb:
            return await sb.exec(
                f"{env['claude']} -p 'case=ccs say hi' < /dev/null",
                timeout=300,
                env={
                    "ANTHROPIC_API_KEY": "any",
                    "ANTHROPIC_BASE_URL": f"{sb.egress_url}{path}",
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                    "DISABLE_AUTOUPDATER": "1",
                },
            )

    run = asyncio.run(agent())
    assert (run.returncode, run.stdout.strip()) == (0, "Done."), run.stderr[-2000:]
    bodies = assert_each_request_is_a_token_exact_sample(env["stack"], "ccs", "ccs-1")
    assert len(bodies[0]["input_ids"]) > 8192, "Claude Code's opening prompt is ~12k tokens"


def test_codex_runs_inside_a_session_with_the_gateway_as_its_only_way_out(env):
    from slime.agent.sandboxes.sandbox_slime import SlimeSandbox

    env["stack"].gateway.open_session("cxs-1")
    path = env["stack"].gateway.session_path("cxs-1")

    async def agent():
        async with SlimeSandbox(env["url"], egress="gateway", memory_mb=4096) as sb:
            await sb.write_file(
                "/home/agent/.codex/config.toml",
                CONFIG_TOML.format(model="slime-actor", base_url=f"{sb.egress_url}{path}/v1", wire_api="responses"),
            )
            return await sb.exec(
                f"node {env['codex']} exec --skip-git-repo-check 'case=cxs say hi' < /dev/null",
                timeout=300,
                env={"CODEX_HOME": "/home/agent/.codex", "OPENAI_API_KEY": "any"},
            )

    run = asyncio.run(agent())
    assert (run.returncode, run.stdout.strip()) == (0, "Done."), run.stderr[-2000:]
    assert_each_request_is_a_token_exact_sample(env["stack"], "cxs", "cxs-1")


SDK_SCRIPT = """
import os, openai
client = openai.OpenAI(base_url=os.environ["SLIME_EGRESS_URL"] + "/v1", api_key=os.environ["KEY"], max_retries=0)
reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "case=sdk hi"}], max_tokens=16)
print(reply.choices[0].message.content)
"""


def test_an_openai_sdk_script_runs_inside_a_session_with_the_gateway_as_its_only_way_out(env):
    from slime.agent.sandboxes.sandbox_slime import SlimeSandbox

    key = env["stack"].gateway.open_session("sdk-1")

    async def agent():
        async with SlimeSandbox(env["url"], egress="gateway", memory_mb=1024) as sb:
            return await sb.exec(f"{sys.executable} -", stdin=SDK_SCRIPT, timeout=120, env={"KEY": key})

    run = asyncio.run(agent())
    assert (run.returncode, run.stdout) == (0, "Done.\n"), run.stderr[-2000:]
    assert_each_request_is_a_token_exact_sample(env["stack"], "sdk", "sdk-1")
