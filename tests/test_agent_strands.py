"""Strands agents (`strands-agents`, `strands-sglang`: PyPI, Python >= 3.12) on our stack: scripted
engines behind the real sglang-router, as in `test_agent_gateway.py` (whose fixture and checks
these tests reuse). A Strands tool agent on its OpenAI provider completes a session against the
agent gateway, whose recorded trajectory is token-exact; the same agent on strands-sglang's
`SGLangModel` (SGLang's native `/generate`, what slime's Strands example uses) runs against the
router, and its own token-in/token-out record holds exactly what the engines sampled."""

from __future__ import annotations

import sys

import pytest

if sys.version_info < (3, 12):  # reported by `-ra`; .ci/run runs this file in its Python 3.12 venv
    pytest.skip(
        "Strands' SGLang provider (strands-sglang >= 0.5) needs Python >= 3.12: run with `make test PYTHON=python3.12`",
        allow_module_level=True,
    )

from strands import Agent, tool  # noqa: E402
from strands.models.openai import OpenAIModel  # noqa: E402
from strands_sglang import SGLangClient, SGLangModel  # noqa: E402

from slime.testing.agent_stack import assert_chain  # noqa: E402
from slime.utils.types import Sample  # noqa: E402
from tests import test_agent_gateway  # noqa: E402
from tests.test_agent_gateway import assert_token_exact, finish  # noqa: E402

stack = test_agent_gateway.stack  # its module-scoped fixture: scripted engines, the real router, the gateway


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def test_strands_agent_on_its_openai_provider_completes_a_token_exact_gateway_session(stack):
    stack.gateway.open_session("st-1")
    model = OpenAIModel(
        client_args={"base_url": stack.gateway.base_url("st-1"), "api_key": "unused", "max_retries": 0},
        model_id="m",
        params={"max_tokens": 64},
    )
    agent = Agent(model=model, tools=[add], system_prompt="You add numbers.", callback_handler=None)
    result = agent("case=tool-strands 3+4?")
    assert str(result).strip() == "3 + 4 = 7."
    assert result.stop_reason == "end_turn"
    assert agent.messages[2]["content"][0]["toolResult"]["content"] == [{"text": "7"}]

    bodies = stack.requests_of("tool-strands")
    [sample] = finish(stack, "st-1")
    assert len(bodies) == 2
    assert_token_exact(stack, sample, bodies)
    assert sample.metadata["use_tool"] is True


async def test_strands_sglang_provider_records_exactly_what_the_engines_sampled(stack):
    """strands-sglang keeps its own token-in/token-out record: every id it holds as model output
    (mask 1) and every log-prob is what the engines sampled, behind the real router."""
    client = SGLangClient(base_url=stack.router.url, max_retries=0)
    model = SGLangModel(client=client, tokenizer=stack.tok, sampling_params={"max_new_tokens": 64})
    agent = Agent(model=model, tools=[add], system_prompt="You add numbers.", callback_handler=None)
    try:
        result = await agent.invoke_async("case=tool-sglang 3+4?")
    finally:
        await client.close()
    assert str(result).strip() == "3 + 4 = 7."

    bodies = stack.requests_of("tool-sglang")
    answers = [stack.answer(b) for b in bodies]
    assert [len(a["output_ids"]) for a in answers] == [25, 9]
    (p1, a1), (p2, a2) = ((len(b["input_ids"]), len(a["output_ids"])) for b, a in zip(bodies, answers))
    rollout = model.rollout
    assert rollout.segment_info == [(False, p1), (True, a1), (False, p2 - p1 - a1), (True, a2)]
    as_sample = Sample(
        tokens=rollout.token_ids,
        response_length=len(rollout.token_ids) - p1,
        loss_mask=rollout.loss_mask[p1:],
        rollout_log_probs=[lp or 0.0 for lp in rollout.logprobs[p1:]],
    )
    assert_chain(as_sample, [(b["input_ids"], a["output_ids"], a["log_probs"]) for b, a in zip(bodies, answers)])
