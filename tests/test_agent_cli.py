"""Agent CLIs nobody here wrote, from the npm registry, against the gateway on a scripted engine
behind the real sglang-router: Claude Code (`@anthropic-ai/claude-code`, its native linux-x64
binary, which runs under this machine's node 20) completes a session through the Anthropic
Messages API -- a streaming `POST /v1/messages?beta=true` of ~12k tokens of system prompt and
tool schemas -- and the recorded trajectory is exactly what the engine sampled.

The CLI is installed once per machine into ~/.cache/slime/agent-clis with `npm install`; when npm
cannot fetch it the test fails with npm's own error (it is not skipped).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from slime.agent.gateway import GatewayConfig
from slime.testing.agent_stack import AgentStack, assert_chain
from slime.utils.types import Sample

pytestmark = pytest.mark.slow

CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.328"
CLI_CACHE = Path(os.environ.get("SLIME_CACHE", Path.home() / ".cache" / "slime")) / "agent-clis"


def claude_binary() -> Path:
    """The native binary (npm's postinstall, which would link it, is not run: npm 11 blocks it)."""
    binary = CLI_CACHE / "node_modules" / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
    if not binary.exists():
        CLI_CACHE.mkdir(parents=True, exist_ok=True)
        npm = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(CLI_CACHE), CLAUDE_CODE],
                             capture_output=True, text=True, timeout=600)
        assert npm.returncode == 0 and binary.exists(), f"npm install {CLAUDE_CODE} failed:\n{npm.stderr[-2000:]}"
    return binary


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from transformers import AutoTokenizer

    from slime.testing.tiny_model import qwen_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    s = AgentStack(tok, qwen_tokenizer_dir(), lambda case, turn: "Done.", config=GatewayConfig(),
                   log_dir=str(tmp_path_factory.mktemp("router"))).start()
    yield s
    s.stop()


def test_claude_code_completes_a_session_through_the_gateway_token_exact(stack, tmp_path):
    binary = claude_binary()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ANTHROPIC_API_KEY": "any",
           "ANTHROPIC_BASE_URL": stack.gateway.base_url("cc-1", api="anthropic"),
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}
    run = subprocess.run([str(binary), "-p", "case=cc say hi"], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert (run.returncode, run.stdout.strip()) == (0, "Done."), run.stderr[-2000:]

    bodies = stack.requests_of("cc")
    samples = asyncio.run(stack.gateway.finish_session("cc-1", base_sample=Sample(index=0, prompt=""), reward=1.0))
    assert len(bodies) >= 1 and len(bodies[0]["input_ids"]) > 8192, "Claude Code's opening prompt is ~12k tokens"
    assert len(samples) == len(bodies)  # each request of this session is its own root-to-leaf chain here
    answers = {tuple(b["input_ids"]): stack.answer(b) for b in bodies}
    for sample in samples:
        prompt = tuple(sample.tokens[:len(sample.tokens) - sample.response_length])
        a = answers[prompt]
        assert_chain(sample, [(list(prompt), a["output_ids"], a["log_probs"])])
