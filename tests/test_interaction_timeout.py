"""An interaction that never returns fails its sample, named with --interaction-timeout and counted,
instead of hanging the rollout (170 s observed before, --tool-call-timeout did not apply)."""

from __future__ import annotations

import asyncio

import pytest

from slime.cli.args import ArgError, parse_args
from slime.interactions.adapter import InteractionAdapter, InteractionError
from slime.interactions.sample_interaction import SampleInteraction

OUTER_BOUND_S = 60.0  # the old code hung here forever: fail instead of hanging the suite


class NeverAnswers:
    """verl's BaseInteraction shape, async, with one method that waits forever."""

    def __init__(self, stuck: str):
        self.stuck = stuck

    async def _maybe_wait(self, method: str) -> None:
        if method == self.stuck:
            await asyncio.Event().wait()

    async def start_interaction(self, instance_id, **kwargs):
        await self._maybe_wait("start_interaction")

    async def generate_response(self, instance_id, messages, **kwargs):
        await self._maybe_wait("generate_response")
        return False, "go on", 0.0, {}

    async def finalize_interaction(self, instance_id):
        await self._maybe_wait("finalize_interaction")


async def one_sample(stuck: str) -> tuple[SampleInteraction, InteractionAdapter]:
    adapter = InteractionAdapter(NeverAnswers(stuck), "user", "tests.NeverAnswers", timeout=0.2)
    sample = SampleInteraction(adapter, {"name": "user"}, 7)
    return sample, adapter


@pytest.mark.parametrize("stuck", ["start_interaction", "generate_response"])
async def test_a_call_that_never_returns_fails_naming_the_flag(stuck):
    sample, adapter = await one_sample(stuck)

    async def trajectory():
        await sample.start()
        return await sample.respond([{"role": "user", "content": "hi"}])

    with pytest.raises(InteractionError) as e:
        await asyncio.wait_for(trajectory(), OUTER_BOUND_S)
    assert str(e.value) == (
        f"interaction 'user' (tests.NeverAnswers).{stuck}() did not return within 0.2 s (--interaction-timeout)"
    )
    assert adapter.timeouts == 1


async def test_a_finalize_that_never_returns_is_reported_not_hung():
    sample, adapter = await one_sample("finalize_interaction")
    await sample.start()
    assert (await sample.respond([{"role": "user", "content": "hi"}])).content == "go on"
    error = await asyncio.wait_for(sample.finalize(), OUTER_BOUND_S)
    assert error == (
        "interaction 'user' finalize_interaction failed: InteractionError: interaction 'user' "
        "(tests.NeverAnswers).finalize_interaction() did not return within 0.2 s (--interaction-timeout)"
    )
    assert adapter.timeouts == 1


def test_the_flag_has_a_bound_by_default_and_refuses_zero():
    assert parse_args([]).interaction_timeout == 300.0
    with pytest.raises(ArgError, match=r"^--interaction-timeout: must be > 0, got 0.0"):
        parse_args(["--interaction-timeout", "0"])
