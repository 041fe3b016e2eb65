"""Tools and interactions named by verl's class names grade as verl does (string comparison, verl's
extraction rules, mathruler for geo3k); slime's numeric graders stay under slime's names."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.interactions.registry import VERL_EQUIVALENTS as INTERACTIONS
from slime.interactions.utils.interaction_registry import get_interaction_class
from slime.tools.geo3k_tool import Geo3kTool
from slime.tools.gsm8k_tool import Gsm8kTool
from slime.tools.schemas import OpenAIFunctionToolSchema
from slime.tools.verl_answer_tools import VerlGeo3kTool, VerlGsm8kTool
from slime.tools.verl_compat import resolve_tool_class
from slime.utils.verl_reward_score import gsm8k
from tests.upstream_verl import verl_gsm8k_score as verl_reference

SCHEMA = OpenAIFunctionToolSchema.model_validate(
    {
        "type": "function",
        "function": {"name": "calc", "description": "d", "parameters": {"type": "object", "properties": {}}},
    }
)


def submit(cls, answer: str, ground_truth) -> tuple[float, float]:
    """(the step reward, the final reward) of one submission."""

    async def go():
        tool = cls({}, SCHEMA)
        iid, _ = await tool.create(create_kwargs={"ground_truth": ground_truth})
        _, step, _ = await tool.execute(iid, {"answer": answer})
        return step, await tool.calc_reward(iid)

    return asyncio.run(go())


# (answer, ground truth, verl's reward, slime's numeric reward)
GSM8K_CASES = [
    ("72", "72", 1.0, 1.0),
    ("72.0", "72", 0.0, 1.0),
    ("1000", "1,000", 0.0, 1.0),
    ("1,000", "1000", 0.0, 1.0),
    ("7,2", "72", 0.0, 1.0),
    ("#### 18", "18", 1.0, 1.0),
    ("the answer is 5", "5", 1.0, 1.0),
    ("$18", "18", 1.0, 1.0),
    ("18", 18, 0.0, 1.0),
]


@pytest.mark.parametrize("answer,truth,verl,ours", GSM8K_CASES)
def test_gsm8k_tool_grades_as_verl_under_verl_name(answer, truth, verl, ours):
    cls, _ = resolve_tool_class("verl.tools.gsm8k_tool.Gsm8kTool")
    assert cls is VerlGsm8kTool
    assert submit(cls, answer, truth)[1] == verl
    assert submit(Gsm8kTool, answer, truth)[1] == ours
    # the reference: verl's own scorer on what verl's tool would score
    prefixed = answer if answer.startswith("#### ") else "#### " + answer
    assert verl_reference.compute_score(prefixed, truth, method="flexible", format_score=0.0, score=1.0) == verl


@pytest.mark.parametrize(
    "answer,truth,verl,ours",
    [
        ("\\boxed{90}", "90", 1.0, 0.0),
        ("90", "90", 1.0, 1.0),
        ("45^\\circ", "45", 1.0, 1.0),
        ("\\frac{1}{2}", "0.5", 1.0, 1.0),
        ("2/4", "1/2", 0.0, 0.0),
        ("91", "90", 0.0, 0.0),
    ],
)
def test_geo3k_tool_grades_as_verl_under_verl_name(answer, truth, verl, ours):
    cls, _ = resolve_tool_class("verl.tools.geo3k_tool.Geo3kTool")
    assert cls is VerlGeo3kTool
    assert submit(cls, answer, truth)[1] == verl
    assert submit(Geo3kTool, answer, truth)[1] == ours


def test_verl_tool_rewards_follow_the_last_submission():
    """verl: the step reward is 0 only when the score rose; the final reward is the last submission's."""

    async def go():
        tool = VerlGsm8kTool({}, SCHEMA)
        iid, _ = await tool.create(create_kwargs={"ground_truth": "3"})
        steps = [(await tool.execute(iid, {"answer": a}))[1] for a in ("3", "3", "4")]
        return steps, await tool.calc_reward(iid)

    assert asyncio.run(go()) == ([0.0, -0.05, -0.05], 0.0)


def test_the_gsm8k_interaction_under_verl_name_is_verls():
    cls = get_interaction_class("verl.interactions.gsm8k_interaction.Gsm8kInteraction")
    assert cls.__module__ == "slime.interactions.verl_gsm8k_interaction"
    assert INTERACTIONS["verl.interactions.gsm8k_interaction.Gsm8kInteraction"] == f"{cls.__module__}.{cls.__name__}"


TEXT = st.lists(
    st.sampled_from(["#### ", "####", "1", "7", "0", ",", ".", "-", "$", " ", "a", "\n", "72", "1,000"]), max_size=40
).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    TEXT,
    st.sampled_from(["72", "1000", "1,000", "7", "-1", ".", "0.5"]),
    st.sampled_from(["strict", "flexible"]),
    st.integers(0, 400),
)
def test_gsm8k_score_is_verls(text, truth, method, pad):
    """Our verl-named scorer against verl's own file on random texts (the 300-character clip included)."""
    text = "x" * pad + text
    assert gsm8k.extract_solution(text, method) == verl_reference.extract_solution(text, method)
    assert gsm8k.compute_score(text, truth, method) == verl_reference.compute_score(text, truth, method)


GEO3K_TEXT = st.lists(
    st.sampled_from(
        [
            "90",
            "45",
            "\\boxed{",
            "}",
            "^\\circ",
            "\\frac{1}{2}",
            "0.5",
            "1/2",
            " ",
            "x=",
            "2\\sqrt{3}",
            "<think>",
            "</think>",
            "-",
            ".",
        ]
    ),
    max_size=8,
).map("".join)


@settings(max_examples=150, deadline=None)
@given(GEO3K_TEXT, st.sampled_from(["90", "45", "0.5", "\\frac{1}{2}", "2\\sqrt{3}", "-1"]))
def test_verl_named_tools_grade_as_verls_own_files(answer, truth):
    """The verl-named gsm8k and geo3k tools against verl's own scorers (`tests/upstream_verl/`, verl's
    latest commit), called as verl's tools call them, on random submissions."""
    from tests.upstream_verl import verl_geo3k_score

    assert submit(VerlGeo3kTool, answer, truth)[1] == verl_geo3k_score.compute_score(
        answer, truth, use_boxed=False, format_score=0.0
    )
    prefixed = answer if answer.startswith("#### ") else "#### " + answer
    assert submit(VerlGsm8kTool, answer, truth)[1] == verl_reference.compute_score(
        prefixed, truth, method="flexible", format_score=0.0, score=1.0
    )
