"""The per-sample machinery the multi-turn loop is built from, used on its own (no router, no plugin):
one sample's tools (`slime.tools.trajectory_tools`), its interaction (`slime.interactions.sample_interaction`)
and the loop's token budgets (`rollout_plugins.multi_turn.budgets`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout_plugins.multi_turn.budgets import TokenBudgets
from slime.interactions.adapter import InteractionAdapter
from slime.interactions.registry import InteractionSet
from slime.interactions.sample_interaction import SampleInteraction
from slime.tools.chat_format import ChatDelta, ParseError, ToolCall
from slime.tools.registry import load_tool_config
from slime.tools.trajectory_tools import ToolCallLimits, TrajectoryTools
from slime.utils.trajectory import TrajectoryRecord

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def delta():
    from transformers import AutoTokenizer

    from slime.testing.tiny_model import qwen_tokenizer_dir

    return ChatDelta(AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir())))


def calculator_tools(delta: ChatDelta, **limits) -> TrajectoryTools:
    return TrajectoryTools(
        load_tool_config(ROOT / "configs" / "example_tool.yaml"), TrajectoryRecord(), delta, ToolCallLimits(**limits)
    )


async def test_a_turns_items_are_answered_in_order_and_every_refusal_is_recorded(delta):
    tools = calculator_tools(delta, max_parallel_calls=2)
    assert tools.select(None, None) == ["calculator"]
    await tools.create(["calculator"], 7)
    assert tools.instances["calculator"].startswith("7-")
    items = [
        ParseError("malformed_json", "bad JSON", "{oops", 0),
        ToolCall("calculator", {"expression": "2*3"}, "", 1),
        ToolCall("search", {"q": "x"}, "", 2),
        ToolCall("calculator", {"expression": "1+1"}, "", 3),
    ]
    msgs = await tools.run_calls(items, turn=4)
    assert msgs == [
        {"role": "tool", "name": "error", "content": "Error: bad JSON. Your output was: {oops"},
        {"role": "tool", "name": "calculator", "content": "6"},
        {"role": "tool", "name": "search", "content": "Error: unknown tool 'search'; available tools: ['calculator']"},
        {
            "role": "tool",
            "name": "calculator",
            "content": "Error: at most 2 tool calls are executed per turn; call #3 (calculator) was not executed",
        },
    ]
    rec = tools.record
    assert [(e.turn, e.tool, e.kind) for e in rec.tool_errors] == [
        (4, "search", "unknown_tool"),
        (4, "calculator", "too_many_calls"),
    ]
    assert [(p.turn, p.kind, p.raw) for p in rec.parse_errors] == [(4, "malformed_json", "{oops")]
    assert [(m.name, m.executed, m.error is None) for m in rec.tool_messages] == [
        (None, False, False),
        ("calculator", True, True),
        ("search", False, False),
        ("calculator", False, False),
    ]
    assert [(s.turn, s.tool, s.reward) for s in rec.step_rewards] == [(4, "calculator", 0.0)]
    await tools.release()
    assert rec.tool_errors[2:] == []


@pytest.mark.parametrize(
    "side, expected",
    [
        ("left", "123456...(truncated)"),
        ("right", "(truncated)...567890"),
        ("middle", "123\n...(truncated)...\n890"),
    ],
)
async def test_a_long_answer_is_cut_to_the_token_limit_on_the_chosen_side(delta, side, expected):
    tools = calculator_tools(delta, max_response_tokens=6, truncate_side=side)
    await tools.create(["calculator"], 0)
    [msg] = await tools.run_calls([ToolCall("calculator", {"expression": "1234567890 * 1"}, "", 0)], turn=1)
    assert len(delta.encode("1234567890")) == 10  # one token per digit
    assert msg["content"] == expected and tools.record.tool_messages[0].truncated is True


async def test_calls_left_when_a_trajectory_ends_are_recorded_as_not_executed(delta):
    tools = calculator_tools(delta)
    tools.record_unanswered(
        [
            ToolCall("calculator", {"expression": "1"}, "", 0),
            ParseError("cut_off", "the turn ended inside a tool call", "<tool_call>", 1),
        ],
        turn=2,
        why="--max-turns was reached",
    )
    rec = tools.record
    assert [(e.tool, e.kind, e.message) for e in rec.tool_errors] == [
        ("calculator", "not_executed", "not executed: --max-turns was reached")
    ]
    assert [(m.name, m.error) for m in rec.tool_messages] == [
        ("calculator", "not executed: --max-turns was reached"),
        (None, "the turn ended inside a tool call"),
    ]


def test_the_next_turn_gets_the_smallest_budget_and_a_tie_names_the_context_budget():
    budgets = TokenBudgets(response=100, context=150, per_turn=30)
    assert budgets.room(total=60, prompt_len=50) == (30, "turn_cap")
    assert budgets.room(total=140, prompt_len=50) == (10, "context_budget")  # response and context both 10
    assert budgets.room(total=130, prompt_len=40) == (10, "response_budget")  # context 20
    assert budgets.fits(10, total=140, prompt_len=50) and not budgets.fits(11, total=140, prompt_len=50)
    assert TokenBudgets(response=5, context=None, per_turn=None).room(total=12, prompt_len=10) == (3, "response_budget")


class Judge:
    def __init__(self, config):
        self.events = []

    async def start_interaction(self, instance_id=None, **kwargs):
        self.events.append(("start", instance_id, kwargs))
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        return True, f"seen {len(messages)}", 1.0, {}

    async def calculate_score(self):
        return 0.0

    async def finalize_interaction(self, instance_id, **kwargs):
        raise RuntimeError("judge is gone")


async def test_a_samples_interaction_is_finalized_only_once_started_and_a_failure_is_returned():
    judge = Judge({})
    interactions = InteractionSet([InteractionAdapter(judge, "judge", "tests.Judge")])
    with pytest.raises(ValueError, match=r"--interaction-config-path: sample 5: the prompt is a rendered string"):
        SampleInteraction.choose(interactions, {"name": "judge"}, 5, has_messages=False)
    one = SampleInteraction.choose(interactions, {"name": "judge", "q": 1}, 5, has_messages=True)
    assert one.name == "judge" and await one.finalize() is None  # never started: nothing to finalize
    await one.start()
    assert one.instance_id.startswith("5-") and judge.events == [("start", one.instance_id, {"name": "judge", "q": 1})]
    reply = await one.respond([{"role": "user", "content": "hi"}])
    assert (reply.terminate, reply.content, reply.score) == (True, "seen 1", 1.0)
    assert await one.finalize() == ("interaction 'judge' finalize_interaction failed: RuntimeError: judge is gone")
