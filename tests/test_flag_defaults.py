"""A flag's default is written once: code that reads a flag from a namespace built by hand (slime's train.py,
a plugin, a test) gets the parser's default, never one restated at the call site."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from slime.cli.honest_flags import _default
from slime.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[1]
# a fallback that is a label in a message, not a value the code acts on
LABELS = {("rollout_plugins/multi_turn/context.py", "hf_checkpoint")}


def parser_defaults() -> dict:
    return {a.dest: _default(a) for a in build_parser()._actions}  # noqa: SLF001


def source_files() -> list[Path]:
    return sorted([*ROOT.glob("slime/**/*.py"), *ROOT.glob("rollout_plugins/**/*.py")])


def restated_defaults(paths: list[Path], root: Path = ROOT):
    """(file, line, flag, fallback) of every `getattr(args, "flag", literal)` / `flag_value(args, "flag", literal)`
    whose literal is not None (None means "absent": the code decides what that means)."""
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and len(node.args) >= 3):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            target, flag = node.args[0], node.args[1]
            if name not in ("getattr", "flag_value") or not (
                isinstance(flag, ast.Constant) and isinstance(flag.value, str)
            ):
                continue
            if (getattr(target, "id", None) or getattr(target, "attr", None)) != "args":
                continue
            try:
                fallback = ast.literal_eval(node.args[2])
            except ValueError:
                continue
            if fallback is not None:
                yield path.relative_to(root).as_posix(), node.lineno, flag.value, fallback


def test_no_call_site_restates_a_flag_default_that_differs_from_the_parser():
    defaults = parser_defaults()
    drifted = [
        f"{where}:{line} {flag}: {fallback!r} here, {defaults[flag]!r} in the parser"
        for where, line, flag, fallback in restated_defaults(source_files())
        if flag in defaults
        and fallback != defaults[flag]
        and (where, flag) not in LABELS
        and not (defaults[flag] is None and not fallback)
    ]  # unset: False / 0 read as None is
    assert drifted == []


def test_the_scan_finds_the_shapes_the_code_used(tmp_path):
    """The two drifts this test was written for, as they were written (guards it against finding nothing)."""
    old = tmp_path / "old.py"
    old.write_text(
        "def f(args, self):\n    a = getattr(args, 'request_max_retries', 8)\n"
        "    b = int(flag_value(self.args, 'max_tool_response_tokens', 0))\n"
        "    c = getattr(args, 'rollout_seed', None)\n"
    )
    assert list(restated_defaults([old], tmp_path)) == [
        ("old.py", 2, "request_max_retries", 8),
        ("old.py", 3, "max_tool_response_tokens", 0),
    ]


def test_the_engine_client_of_a_hand_built_namespace_retries_as_the_command_line_does():
    from slime.rollout.engine_client import EngineClient
    from slime.utils.endpoints import Endpoints
    from slime.utils.plugin_args import completed

    # completed where it enters (runtime.current, RolloutManager), not by a fallback in from_args
    client = EngineClient.from_args(
        completed(SimpleNamespace(sglang_server_concurrency=1, rollout_num_engines=1)),
        Endpoints(router_url="http://127.0.0.1:9"),
    )
    assert client.retry_policy.max_retries == parser_defaults()["request_max_retries"] == 100


def test_tool_limits_of_a_hand_built_namespace_are_the_flags_defaults():
    from slime.cli.finalize import complete_namespace
    from slime.tools.trajectory_tools import ToolCallLimits

    d = parser_defaults()
    limits = ToolCallLimits.from_args(complete_namespace(SimpleNamespace()))
    assert limits == ToolCallLimits()
    assert (
        (limits.max_parallel_calls, limits.max_response_tokens, limits.truncate_side)
        == (d["max_parallel_calls"], d["max_tool_response_tokens"], d["tool_response_truncate_side"])
        == (4, 512, "middle")
    )


def test_a_namespace_without_a_backend_resolves_auto_as_the_parser_does(monkeypatch):
    from slime.engine import default_model
    from slime.utils.plugin_args import completed

    monkeypatch.setattr(default_model, "cuda_available", lambda: True)
    with pytest.raises(ValueError, match="--hf-checkpoint is required with --rollout-backend sglang"):
        default_model.resolve_hf_checkpoint(completed(SimpleNamespace(hf_checkpoint=None)))
    assert parser_defaults()["rollout_backend"] == "auto"


def test_the_fully_async_pool_holds_a_rollout_of_the_default_batch_size():
    from slime.rollout.defaults import ROLLOUT_BATCH_SIZE

    assert parser_defaults()["rollout_batch_size"] == ROLLOUT_BATCH_SIZE == 4
    assert parser_defaults()["clip_grad"] == 1.0  # the trainer reads args.clip_grad, no fallback of its own


async def test_a_dict_reward_gets_the_tool_rewards_on_the_reward_key_entry_or_is_refused(monkeypatch):
    from rollout_plugins.multi_turn import tool_reward
    from slime.utils.trajectory import TrajectoryRecord
    from slime.utils.types import Sample

    async def rm(args, sample):
        return {"acc": 1.0, "fmt": 0.5}

    import slime.rollout.rm_hub as rm_hub

    monkeypatch.setattr(rm_hub, "async_rm", rm)
    record = TrajectoryRecord()
    record.tool_rewards = {"calc": 0.25}
    args = SimpleNamespace(tool_reward_mode="add", rm_type="math", custom_rm_path=None, reward_key=None)

    def fresh():
        sample = Sample(index=0, prompt="p", status=Sample.Status.COMPLETED)
        record.store(sample)
        return sample

    with pytest.raises(ValueError, match="--reward-key"):
        await tool_reward.add_tool_reward(args, fresh())
    args.reward_key = "acc"
    sample = fresh()
    await tool_reward.add_tool_reward(args, sample)
    assert sample.reward == {"acc": 1.25, "fmt": 0.5}
