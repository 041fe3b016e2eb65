"""The agent gateway on the embedded CPU engine with the default model (SmolLM2-135M-Instruct):
an OpenAI-SDK session of two turns completes and its trajectory holds exactly what the engine
sampled. The model's words do not matter here, the plumbing does."""

from __future__ import annotations

import asyncio

import openai
import pytest

from slime.agent.gateway.server import Gateway, GatewayConfig
from slime.testing.agent_stack import RecordingClient, assert_chain
from slime.utils.endpoints import Endpoints
from slime.utils.types import Sample
from tests.hf_engine_fixtures import run_engine

pytestmark = pytest.mark.slow


def test_openai_sdk_session_on_the_default_model_is_token_exact(engine_fork_server):
    from transformers import AutoTokenizer

    from slime.engine.default_model import ensure_default_model

    model = ensure_default_model()
    tok = AutoTokenizer.from_pretrained(str(model))
    with run_engine(model, fork_server=engine_fork_server) as url:  # warm: the fork server has torch imported
        client = RecordingClient(Endpoints(url, [url]), tokenizer=tok, request_timeout=120.0)
        gw = Gateway(client, tokenizer=tok, config=GatewayConfig(max_context_tokens=2048)).start()
        try:
            msgs = [{"role": "user", "content": "What is the capital of France?"}]
            gw.open_session("smol-1")
            with openai.OpenAI(base_url=gw.base_url("smol-1"), api_key="x", max_retries=0) as sdk:
                r1 = sdk.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0.0)
                msgs += [
                    {"role": "assistant", "content": r1.choices[0].message.content},
                    {"role": "user", "content": "And of Italy?"},
                ]
                r2 = sdk.chat.completions.create(model="m", messages=msgs, max_tokens=12, stream=False)
            samples = asyncio.run(gw.finish_session("smol-1", base_sample=Sample(index=0, prompt=""), reward=1.0))
        finally:
            gw.stop()
    assert r2.usage.completion_tokens == len(client.answers[1][1].token_ids)
    turns = [(p, out.token_ids, out.log_probs) for p, out in client.answers]
    # the client replays our answer as we sent it: the second prompt extends the first, one chain
    [sample] = samples
    assert_chain(sample, turns)
    assert all(lp < 0 for lp, m in zip(sample.rollout_log_probs, sample.loss_mask) if m)
