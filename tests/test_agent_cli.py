"""Agent CLIs nobody here wrote, from the npm registry, against the gateway on a scripted engine
behind the real sglang-router, each completing a session whose trajectory is exactly what the
engine sampled: Claude Code (`@anthropic-ai/claude-code`, its native linux-x64 binary, which runs
under this machine's node 20) through Anthropic Messages -- a streaming `POST /v1/messages?beta=true`
of ~12k tokens of system prompt and tool schemas -- and Codex (`@openai/codex`) through a streaming
`POST /v1/responses` (its config.toml names the gateway as a model provider).

The CLIs are installed once per machine into ~/.cache/slime/agent-clis with `npm install`; when npm
cannot fetch one the test fails with npm's own error (it is not skipped).
"""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest

from slime.agent.gateway.server import GatewayConfig
from slime.agent.sandboxes.harness.codex import CONFIG_TOML
from slime.testing.agent_clis import CLAUDE_CODE, CLI_CACHE, CODEX, npm_installed  # noqa: F401 - (CLI_CACHE: for importers)
from slime.testing.agent_stack import AgentStack, assert_chain
from slime.utils.types import Sample

pytestmark = pytest.mark.slow


def assert_each_request_is_a_token_exact_sample(stack, case: str, sid: str) -> list:
    """One request per chain here (the scripted answer ends the run); each chain exactly what was sampled."""
    bodies = stack.requests_of(case)
    samples = asyncio.run(stack.gateway.finish_session(sid, base_sample=Sample(index=0, prompt=""), reward=1.0))
    assert bodies and len(samples) == len(bodies)
    answers = {tuple(b["input_ids"]): stack.answer(b) for b in bodies}
    for sample in samples:
        prompt = tuple(sample.tokens[: len(sample.tokens) - sample.response_length])
        a = answers[prompt]
        assert_chain(sample, [(list(prompt), a["output_ids"], a["log_probs"])])
    return bodies


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = AgentStack.started_on_tiny_qwen(
        lambda case, turn: "Done.", config=GatewayConfig(), log_dir=str(tmp_path_factory.mktemp("router"))
    )
    yield s
    s.stop()


def test_claude_code_completes_a_session_through_the_gateway_token_exact(stack, tmp_path):
    # its native binary (npm 11 does not run the postinstall that would link it as `claude`)
    binary = npm_installed(CLAUDE_CODE, "@anthropic-ai/claude-code-linux-x64/claude")
    stack.gateway.open_session("cc-1")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "ANTHROPIC_API_KEY": "any",
        "ANTHROPIC_BASE_URL": stack.gateway.base_url("cc-1", api="anthropic"),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    run = subprocess.run(
        [str(binary), "-p", "case=cc say hi"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert (run.returncode, run.stdout.strip()) == (0, "Done."), run.stderr[-2000:]
    bodies = assert_each_request_is_a_token_exact_sample(stack, "cc", "cc-1")
    assert len(bodies[0]["input_ids"]) > 8192, "Claude Code's opening prompt is ~12k tokens"


def test_codex_completes_a_session_through_the_responses_api_token_exact(stack, tmp_path):
    launcher = npm_installed(CODEX, "@openai/codex/bin/codex.js")
    home = tmp_path / ".codex"
    home.mkdir()
    stack.gateway.open_session("cx-1")
    (home / "config.toml").write_text(
        CONFIG_TOML.format(model="slime-actor", base_url=stack.gateway.base_url("cx-1"), wire_api="responses")
    )
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CODEX_HOME": str(home), "OPENAI_API_KEY": "any"}
    run = subprocess.run(
        ["node", str(launcher), "exec", "--skip-git-repo-check", "case=cx say hi"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert (run.returncode, run.stdout.strip()) == (0, "Done."), run.stderr[-2000:]
    assert_each_request_is_a_token_exact_sample(stack, "cx", "cx-1")
