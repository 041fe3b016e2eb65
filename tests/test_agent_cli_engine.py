"""Claude Code and Codex (from npm, as in tests/test_agent_cli.py) against the gateway on the
EMBEDDED engine behind the real sglang-router: each completes a session and what the gateway
recorded is exactly what the engine sampled (ids, log-probs; template deltas masked 0).

The model is the tests' tiny random Qwen2 with its context raised to 32k in a copy of its config,
since Claude Code's opening prompt (~12k tokens) outgrows SmolLM2's 8k. Its words are random, so a
CLI may give up (its exit code is not checked); the plumbing is what must hold. Each session caps
max_new_tokens so CPU decode stays short.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

import pytest

from slime.agent.gateway.server import Gateway, GatewayConfig
from slime.agent.sandboxes.harness.codex import CONFIG_TOML
from slime.fleet.router import Router
from slime.testing.agent_clis import CLAUDE_CODE, CODEX, npm_installed
from slime.testing.agent_stack import RecordingClient, assert_chain
from slime.utils.endpoints import Endpoints
from slime.utils.types import Sample
from tests.hf_engine_fixtures import run_engine

pytestmark = pytest.mark.slow

LONG_CONTEXT = 32768
MAX_NEW_TOKENS = 8


@pytest.fixture(scope="module")
def long_context_model(tiny_model_dir, tmp_path_factory):
    """The tiny model's files with `max_position_embeddings` raised in a copy of its config."""
    out = tmp_path_factory.mktemp("tiny-long-context")
    for f in tiny_model_dir.iterdir():
        if f.is_file():
            (out / f.name).symlink_to(f)
    (out / "config.json").unlink()
    config = json.loads((tiny_model_dir / "config.json").read_text())
    config["max_position_embeddings"] = LONG_CONTEXT
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def gateway(long_context_model, tmp_path_factory, engine_fork_server):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(long_context_model))
    with run_engine(long_context_model, fork_server=engine_fork_server) as url:  # warm: torch imported
        router = Router(log_dir=str(tmp_path_factory.mktemp("router"))).start()
        try:
            router.add_worker(url)
            client = RecordingClient(Endpoints(router.url, [url]), tokenizer=tok, request_timeout=120.0, max_retries=1)
            gw = Gateway(client, tokenizer=tok, config=GatewayConfig()).start()
            try:
                yield gw
            finally:
                gw.stop()
        finally:
            router.stop()


def assert_sampled_exactly(gw: Gateway, sid: str, known: int) -> list[Sample]:
    """Each chain of the session is the engine's answers that lie on it, token-exact, and every
    answer the engine gave lies on a chain (nothing lost); returns the chains."""
    samples = asyncio.run(gw.finish_session(sid, base_sample=Sample(index=0, prompt=""), reward=0.0))
    answers = gw.client.answers[known:]
    assert answers and samples, "no request went through the gateway to the engine"
    placed: set[int] = set()
    for sample in samples:
        on_chain = sorted(
            (
                i
                for i, (p, out) in enumerate(answers)
                if sample.tokens[: len(p) + len(out.token_ids)] == p + out.token_ids
            ),
            key=lambda i: len(answers[i][0]),
        )
        assert on_chain, "a recorded chain holds no answer the engine sampled"
        assert_chain(sample, [(answers[i][0], answers[i][1].token_ids, answers[i][1].log_probs) for i in on_chain])
        assert all(lp <= 0 for lp, m in zip(sample.rollout_log_probs, sample.loss_mask) if m)
        placed.update(on_chain)
    assert placed == set(range(len(answers))), "an answer of the engine is missing from the trajectory"
    return samples


def test_claude_code_completes_a_session_on_the_embedded_engine_token_exact(gateway, tmp_path):
    binary = npm_installed(CLAUDE_CODE, "@anthropic-ai/claude-code-linux-x64/claude")
    known = len(gateway.client.answers)
    gateway.open_session("cc-engine", sampling_defaults={"max_new_tokens": MAX_NEW_TOKENS})
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "ANTHROPIC_API_KEY": "any",
        "ANTHROPIC_BASE_URL": gateway.base_url("cc-engine", api="anthropic"),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    run = subprocess.run(
        [str(binary), "-p", "say hi"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    samples = assert_sampled_exactly(gateway, "cc-engine", known)
    longest = max(len(s.tokens) for s in samples)
    assert longest > 8192, f"Claude Code's opening prompt is ~12k tokens, not {longest}: {run.stderr[-2000:]}"


def test_codex_completes_a_session_on_the_embedded_engine_token_exact(gateway, tmp_path):
    launcher = npm_installed(CODEX, "@openai/codex/bin/codex.js")
    known = len(gateway.client.answers)
    gateway.open_session("cx-engine", sampling_defaults={"max_new_tokens": MAX_NEW_TOKENS})
    home = tmp_path / ".codex"
    home.mkdir()
    (home / "config.toml").write_text(
        CONFIG_TOML.format(model="slime-actor", base_url=gateway.base_url("cx-engine"), wire_api="responses")
    )
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CODEX_HOME": str(home), "OPENAI_API_KEY": "any"}
    subprocess.run(
        ["node", str(launcher), "exec", "--skip-git-repo-check", "say hi"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert_sampled_exactly(gateway, "cx-engine", known)
