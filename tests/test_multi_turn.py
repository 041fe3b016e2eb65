"""The multi-turn loop against a scripted SGLang engine behind the real sglang-router.

Each test's prompt carries a `case:<name>` marker; the engine script finds it, counts the
assistant turns already in `input_ids` and answers with the token ids the test chose, so every
expected token, mask and log-prob below is known exactly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from rollout_plugins.multi_turn import MultiTurnContext, generate
from slime.testing.runtime import bind_runtime
from slime.tools.flags import tool_defaults
from slime.tools.base_tool import BaseTool
from slime.tools.schemas import ToolResponse
from slime.utils.misc import find_free_port
from slime.utils.types import Sample
from slime.testing.until import until_async
from tests.conftest import native_tools_yaml

pytestmark = pytest.mark.usefixtures("runtime_closed_on_the_test_loop")
ROOT = Path(__file__).resolve().parents[1]
CASES: dict[str, Callable[[int, dict], dict]] = {}
EVENTS: list[tuple[str, str, str]] = []  # (tool, event, instance_id)
RUNNING_TOGETHER: list[str] = []  # instance ids of "together<N>" executions that started


_CASE = re.compile(r"case:(\S+)")


class TrackingTool(BaseTool):
    """Records the lifecycle; `parameters.mode` makes it fail or sleep, `create_kwargs.fail` fails create."""

    async def create(self, instance_id=None, fail=False, **kw):
        EVENTS.append((self.name, "create", instance_id))
        if fail:
            raise RuntimeError("create failed on purpose")
        return instance_id, ToolResponse()

    async def execute(self, instance_id, parameters, **kw):
        EVENTS.append((self.name, "execute", instance_id))
        mode = parameters.get("mode", "ok")
        if mode == "raise":
            raise ValueError("boom")
        if mode.startswith("sleep"):
            await asyncio.sleep(float(mode[5:]))
        if mode.startswith("together"):  # returns once N executions run at the same time (else fails)
            RUNNING_TOGETHER.append(instance_id)
            await asyncio.wait_for(until_async(lambda: len(RUNNING_TOGETHER) >= int(mode[8:])), 120)
        return ToolResponse(text=f"done {mode} {json.dumps(kw, sort_keys=True)}"), 0.25, {}

    async def calc_reward(self, instance_id, **kw):
        return float(kw.get("bonus", 0.5))

    async def release(self, instance_id, **kw):
        EVENTS.append((self.name, "release", instance_id))


TOOLS_YAML = native_tools_yaml(
    (
        "slime.tools.gsm8k_tool.Gsm8kTool",
        "calc_gsm8k_reward",
        "check an answer",
        {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    ),
    (
        "slime.tools.example_tools.CalculatorTool",
        "calculator",
        "arithmetic",
        {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    ),
    (
        f"{__name__}.TrackingTool",
        "track",
        "lifecycle probe",
        {"type": "object", "properties": {"mode": {"type": "string", "default": "ok"}}},
    ),
)


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from slime.testing.tiny_model import qwen_tokenizer_dir

    return AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))


@pytest.fixture(scope="module")
def stack(tok, tmp_path_factory):
    """One router + one scripted engine for the module."""
    from slime.fleet.router import Router
    from slime.testing.scripted_engine import ScriptedEngine
    from slime.testing.tiny_model import qwen_tokenizer_dir

    def script(body: dict) -> dict:
        text = tok.decode(body["input_ids"], skip_special_tokens=False)
        case = _CASE.search(text).group(1)
        turn = text.count("<|im_start|>assistant") - 1
        out = dict(CASES[case.split("#")[0]](turn, body))
        limit = body["sampling_params"]["max_new_tokens"]
        if len(out["output_ids"]) > limit:  # honour max_new_tokens like a real engine
            out["output_ids"], out["finish_type"] = out["output_ids"][:limit], "length"
            if out.get("log_probs"):
                out["log_probs"] = out["log_probs"][:limit]
        return out

    model_dir = str(qwen_tokenizer_dir())
    engine = ScriptedEngine(script, model_dir).start()
    router = Router(log_dir=str(tmp_path_factory.mktemp("router"))).start()
    router.add_worker(engine.url)
    cfg = tmp_path_factory.mktemp("cfg") / "tools.yaml"
    cfg.write_text(TOOLS_YAML)
    yield {"router": router, "engine": engine, "config": str(cfg), "model": model_dir}
    router.stop()
    engine.stop()


def make_args(stack, tok, **kw) -> argparse.Namespace:
    base = {
        **tool_defaults(),
        "sglang_router_ip": "127.0.0.1",
        "sglang_router_port": stack["router"].port,
        "hf_checkpoint": stack["model"],
        "rollout_max_response_len": 1024,
        "rollout_max_context_len": None,
        "sglang_server_concurrency": 64,
        "request_timeout": 30.0,
        "request_max_retries": 0,
        "tool_config_path": stack["config"],
        "rm_type": "gsm8k",
        "custom_rm_path": None,
        "group_rm": False,
    }
    args = argparse.Namespace(**{**base, **kw})
    bind_runtime(args, tokenizer=tok)  # share one tokenizer across tests
    return args


IM_END = 151645


def say(tok, text: str, stop: bool = True, lp0: float = -0.5) -> dict[str, Any]:
    ids = tok.encode(text, add_special_tokens=False) + ([IM_END] if stop else [])
    return {"output_ids": ids, "finish_type": "stop", "log_probs": [lp0 - 0.001 * i for i in range(len(ids))]}


def call(name: str, arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def think(text: str) -> str:
    return f"<think>\n{text}\n</think>\n\n"


def sample_for(case: str, tools_kwargs: dict | None = None, label: Any = None, index: int = 0) -> Sample:
    md = {"tools_kwargs": tools_kwargs} if tools_kwargs is not None else {}
    return Sample(
        index=index,
        prompt=[
            {"role": "system", "content": "You are a math expert."},
            {"role": "user", "content": f"case:{case} What is 3 + 4?"},
        ],
        label=label,
        metadata=md,
    )


PARAMS = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "max_new_tokens": 1024,
    "skip_special_tokens": False,
    "no_stop_trim": True,
}


def tool_delta(tok, contents: list[str]) -> list[int]:
    """What Qwen3's template inserts after an assistant turn that ended with <|im_end|>, written out by hand."""
    body = "".join(f"\n<tool_response>\n{c}\n</tool_response>" for c in contents)
    return tok.encode(f"\n<|im_start|>user{body}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)


def schemas(args, names):
    return MultiTurnContext.get(args).tools.schemas(names)


def released_all() -> bool:
    created = [(t, i) for t, e, i in EVENTS if e == "create"]
    released = [(t, i) for t, e, i in EVENTS if e == "release"]
    return sorted(created) == sorted(released)


# ---- the cases ----------------------------------------------------------------------------------
async def test_rollout_req_creation(stack, tok):
    """Prompt rendered with the sample's tools; tools created with create_kwargs; budgets in the request."""
    turns = [say(tok, think("done") + "7")]
    CASES["req"] = lambda t, b: turns[t]
    args = make_args(stack, tok, max_tokens_per_turn=100)
    n0 = len(stack["engine"].requests)
    s = sample_for("req", {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "7"}}}, label="7")
    s = await generate(args, s, dict(PARAMS))
    req = stack["engine"].requests[n0]
    expected = tok.apply_chat_template(
        s.metadata["messages"] if "messages" in s.metadata else s.prompt,
        tools=schemas(args, ["calc_gsm8k_reward"]),
        tokenize=False,
        add_generation_prompt=True,
    )
    assert req["input_ids"] == tok.encode(expected, add_special_tokens=False)
    assert '"name": "calc_gsm8k_reward"' in expected and '"calculator"' not in expected
    assert req["sampling_params"]["max_new_tokens"] == 100 and req["return_logprob"] is True
    assert s.status == Sample.Status.COMPLETED and s.metadata["finish_reason"] == "no_tool_call"
    assert s.metadata["tool_rewards"] == {"calc_gsm8k_reward": 0.0}  # created with the ground truth, never called


async def test_tool_call_basic_case(stack, tok):
    """Two tool calls over three turns: exact tokens, masks and log-probs, rewards, spans."""
    outs = [
        say(tok, think("compute first") + "Let me compute.\n" + call("calculator", {"expression": "3 + 4"}), lp0=-1),
        say(tok, think("now check") + call("calc_gsm8k_reward", {"answer": "7"}), lp0=-2),
        say(tok, think("correct") + "The answer is #### 7", lp0=-3),
    ]
    CASES["basic"] = lambda t, b: outs[t]
    args = make_args(stack, tok, tool_reward_mode="add")
    n0 = len(stack["engine"].requests)
    s = sample_for(
        "basic", {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "#### 7"}}, "calculator": {}}, label="7"
    )
    s = await generate(args, s, dict(PARAMS))
    prompt = tok.encode(
        tok.apply_chat_template(
            s.prompt,
            tools=schemas(args, ["calc_gsm8k_reward", "calculator"]),
            tokenize=False,
            add_generation_prompt=True,
        ),
        add_special_tokens=False,
    )
    d1 = tool_delta(tok, ["7"])
    d2 = tool_delta(tok, ["Current parsed answer='7' reward=1.0"])
    o = [x["output_ids"] for x in outs]
    assert s.tokens == prompt + o[0] + d1 + o[1] + d2 + o[2]
    assert s.response_length == len(s.tokens) - len(prompt)
    assert s.loss_mask == [1] * len(o[0]) + [0] * len(d1) + [1] * len(o[1]) + [0] * len(d2) + [1] * len(o[2])
    lps = [x["log_probs"] for x in outs]
    assert s.rollout_log_probs == pytest.approx(lps[0] + [0.0] * len(d1) + lps[1] + [0.0] * len(d2) + lps[2])
    # the engine was sent exactly the growing trajectory each turn
    reqs = stack["engine"].requests[n0:]
    assert [r["input_ids"] for r in reqs] == [prompt, prompt + o[0] + d1, prompt + o[0] + d1 + o[1] + d2]
    # equal to rendering the whole conversation from scratch (Qwen3 is append-only for these turns)
    assert s.metadata["template_drift"] is False
    md = s.metadata
    assert s.status == Sample.Status.COMPLETED and md["turns"] == 3
    assert md["tool_calls"] == {"calculator": 1, "calc_gsm8k_reward": 1}
    assert md["tool_errors"] == [] and md["parse_errors"] == []
    assert md["step_rewards"] == [
        {"turn": 1, "tool": "calculator", "reward": 0.0},
        {"turn": 2, "tool": "calc_gsm8k_reward", "reward": 0.0},
    ]
    assert md["tool_rewards"] == {"calc_gsm8k_reward": 1.0, "calculator": 0.0}
    assert md["outcome_reward"] == 1.0 and s.reward == 2.0  # --tool-reward-mode add
    spans = md["turn_spans"]
    assert [(x["turn"], x["role"]) for x in spans] == [
        (1, "assistant"),
        (1, "tool"),
        (2, "assistant"),
        (2, "tool"),
        (3, "assistant"),
    ]
    assert spans[-1]["end"] == s.response_length
    assert all(set(s.loss_mask[x["start"] : x["end"]]) == {1 if x["role"] == "assistant" else 0} for x in spans)
    assert md["non_generation_time"] >= 0 and len(md["turn_overhead_s"]) == 2
    assert "<tool_response>\n7\n</tool_response>" in s.response


async def test_parallel_calls(stack, tok):
    """Several calls in one turn run concurrently; calls beyond --max-parallel-calls get an error message."""
    many = "".join(call("track", {"mode": "together2"}) for _ in range(3))
    outs = [say(tok, think("go") + many), say(tok, think("ok") + "done")]
    CASES["parallel"] = lambda t, b: outs[t]
    args = make_args(stack, tok, max_parallel_calls=2)
    RUNNING_TOGETHER.clear()
    s = await generate(args, sample_for("parallel", {"track": {"execute_kwargs": {"k": 1}}}), dict(PARAMS))
    assert len(RUNNING_TOGETHER) == 2  # the two calls ran side by side (each waited for the other)
    assert s.metadata["tool_calls"] == {"track": 2}
    assert [e["kind"] for e in s.metadata["tool_errors"]] == ["too_many_calls"]
    assert s.metadata["non_generation_time"] > 0
    text = s.response
    assert text.count('done together2 {"k": 1}') == 2
    assert text.index('done together2 {"k": 1}') < text.index("at most 2 tool calls are executed per turn; call #3")
    assert text.count("<tool_response>") == 3 and s.status == Sample.Status.COMPLETED


async def test_tools_do_not_hold_the_engine_slot(stack, tok):
    """With one engine slot, three samples' tool calls run at the same time: each call returns only
    once all three are executing, which a loop holding the slot during its tool call never reaches."""
    outs = [say(tok, call("track", {"mode": "together3"})), say(tok, "done")]
    CASES["slot"] = lambda t, b: outs[t]
    args = make_args(stack, tok, sglang_server_concurrency=1)
    RUNNING_TOGETHER.clear()
    res = await asyncio.gather(*(generate(args, sample_for(f"slot#{i}", index=i), dict(PARAMS)) for i in range(3)))
    assert len(RUNNING_TOGETHER) == 3 and all(s.status == Sample.Status.COMPLETED for s in res)
    assert all(s.metadata["tool_errors"] == [] and "done together3" in s.response for s in res)


@pytest.mark.parametrize(
    "bad,kind,needle",
    [
        (
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": }\n</tool_call>',
            "malformed_json",
            "the tool call is not valid JSON",
        ),
        (call("web_search", {"q": "x"}), "unknown_tool", "unknown tool 'web_search'; available tools: ['calculator']"),
        (
            call("calculator", {"expression": 5, "timeout": 9}),
            "invalid_arguments",
            "invalid arguments for 'calculator': (root): Additional properties",
        ),
    ],
)
async def test_bad_calls_are_answered_not_dropped(stack, tok, bad, kind, needle):
    outs = [
        say(tok, think("try") + bad),
        say(tok, think("fix") + call("calculator", {"expression": "3+4"})),
        say(tok, "7"),
    ]
    CASES[f"bad-{kind}"] = lambda t, b: outs[t]
    args = make_args(stack, tok)
    n0 = len(stack["engine"].requests)
    s = await generate(args, sample_for(f"bad-{kind}", {"calculator": {}}), dict(PARAMS))
    assert s.status == Sample.Status.COMPLETED and s.metadata["turns"] == 3
    errors = s.metadata["parse_errors"] if kind == "malformed_json" else s.metadata["tool_errors"]
    assert [e["kind"] for e in errors] == [kind] and needle in errors[0]["message"] + "; " + str(errors[0])
    second = tok.decode(stack["engine"].requests[n0 + 1]["input_ids"])
    assert "<tool_response>\nError: " in second and needle.split(";")[0].split(":")[0] in second
    assert s.metadata["tool_calls"] == {"calculator": 1}


async def test_call_cut_off_by_length(stack, tok):
    """Cut by the per-turn cap: the model is told and continues. Cut by the budget: recorded, TRUNCATED."""
    long_call = think("x") + call("calculator", {"expression": " + ".join(["1"] * 40)})
    outs = [say(tok, long_call), say(tok, "ok")]
    CASES["cut"] = lambda t, b: outs[t]
    s = await generate(
        make_args(stack, tok, max_tokens_per_turn=30), sample_for("cut", {"calculator": {}}), dict(PARAMS)
    )
    assert s.status == Sample.Status.COMPLETED and s.metadata["turns"] == 2
    assert [e["kind"] for e in s.metadata["parse_errors"]] == ["cut_off"]
    assert "cut off by the length limit" in s.response
    assert s.metadata["turn_spans"][0]["end"] == 30 and s.metadata["tool_calls"] == {}
    # now the whole response budget ends inside the call
    s = await generate(
        make_args(stack, tok, rollout_max_response_len=30),
        sample_for("cut", {"calculator": {}}),
        dict(PARAMS, max_new_tokens=30),
    )
    assert s.status == Sample.Status.TRUNCATED and s.metadata["finish_reason"] == "response_budget_exhausted"
    assert [e["kind"] for e in s.metadata["parse_errors"]] == ["cut_off"] and s.response_length == 30


async def test_max_turns(stack, tok):
    CASES["loop"] = lambda t, b: say(tok, call("calculator", {"expression": f"{t}+1"}))
    s = await generate(make_args(stack, tok, max_turns=3), sample_for("loop", {"calculator": {}}), dict(PARAMS))
    md = s.metadata
    assert s.status == Sample.Status.TRUNCATED and md["finish_reason"] == "max_turns" and md["turns"] == 3
    assert md["tool_calls"] == {"calculator": 2}
    assert md["tool_errors"] == [
        {"turn": 3, "tool": "calculator", "kind": "not_executed", "message": "not executed: --max-turns was reached"}
    ]
    assert md["template_drift"] is True  # no <think> blocks: Qwen3 would re-render these turns differently


async def test_per_sample_drift_is_recorded(stack, tok):
    """Compact JSON in a call: the sampled tokens are kept, and the sample says re-rendering would differ."""
    compact = '<tool_call>\n{"name":"calculator","arguments":{"expression":"3+4"}}\n</tool_call>'
    outs = [say(tok, think("go") + compact), say(tok, think("done") + "7")]
    CASES["drift"] = lambda t, b: outs[t]
    s = await generate(make_args(stack, tok), sample_for("drift", {"calculator": {}}), dict(PARAMS))
    assert s.status == Sample.Status.COMPLETED and s.metadata["tool_calls"] == {"calculator": 1}
    assert s.metadata["template_drift"] is True
    assert "re-rendering has" in s.metadata["template_drift_detail"]
    assert '{"name": "calculator"' in s.metadata["template_drift_detail"]
    assert compact in s.response  # what the model sampled, not what the template would write


async def test_over_size_case(stack, tok):
    """Budgets: context and response limits shape max_new_tokens and end the rollout early."""
    CASES["size"] = lambda t, b: say(tok, call("calculator", {"expression": "1+1"}))
    args = make_args(stack, tok)
    s = sample_for("size", {"calculator": {}})
    prompt_len = len(MultiTurnContext.get(args).delta.prompt_ids(s.prompt, schemas(args, ["calculator"])))
    # the prompt alone fills the context
    s = await generate(
        make_args(stack, tok, rollout_max_context_len=prompt_len), sample_for("size", {"calculator": {}}), dict(PARAMS)
    )
    assert s.status == Sample.Status.TRUNCATED and s.metadata["finish_reason"] == "prompt_fills_context"
    assert s.response_length == 0 and s.loss_mask == []
    # the context budget caps each turn and ends the rollout
    n0 = len(stack["engine"].requests)
    ctx = prompt_len + 60
    s = await generate(
        make_args(stack, tok, rollout_max_context_len=ctx), sample_for("size", {"calculator": {}}), dict(PARAMS)
    )
    reqs = stack["engine"].requests[n0:]
    assert reqs[0]["sampling_params"]["max_new_tokens"] == 60
    for r in reqs:
        assert r["sampling_params"]["max_new_tokens"] == ctx - len(r["input_ids"])
    assert s.status == Sample.Status.TRUNCATED and len(s.tokens) <= ctx
    assert s.metadata["finish_reason"] in ("context_budget_exhausted", "budget_exhausted_in_tool_response")


async def test_budget_exhausted_in_tool_response(stack, tok):
    first = say(tok, call("track", {"mode": "ok"}))
    CASES["mid"] = lambda t, b: first
    n = len(first["output_ids"])
    s = await generate(
        make_args(stack, tok, rollout_max_response_len=n + 5),
        sample_for("mid", {"track": {}}),
        dict(PARAMS, max_new_tokens=n + 5),
    )
    assert s.status == Sample.Status.TRUNCATED
    assert s.metadata["finish_reason"] == "budget_exhausted_in_tool_response"
    assert s.metadata["dropped_tool_tokens"] > 5 and s.tokens[-n:] == first["output_ids"]
    assert s.response_length == n and s.loss_mask == [1] * n
    assert s.metadata["tool_calls"] == {"track": 1} and s.metadata["step_rewards"][0]["reward"] == 0.25


async def test_release_on_every_path(stack, tok):
    args = make_args(stack, tok, tool_call_timeout=5.0)
    kw = {"track": {"calc_reward_kwargs": {"bonus": 2.0}, "release_kwargs": {}}, "calculator": {}}
    EVENTS.clear()
    # success, with calc_reward_kwargs
    CASES["ok"] = lambda t, b: [say(tok, call("track", {})), say(tok, "fine")][t]
    s = await generate(args, sample_for("ok", kw), dict(PARAMS))
    assert s.metadata["tool_rewards"] == {"track": 2.0, "calculator": 0.0} and released_all()
    # the tool raises: the model is told, the rollout goes on
    CASES["raise"] = lambda t, b: [say(tok, call("track", {"mode": "raise"})), say(tok, "fine")][t]
    s = await generate(args, sample_for("raise", kw), dict(PARAMS))
    assert s.status == Sample.Status.COMPLETED and "tool 'track' failed: ValueError: boom" in s.response
    assert s.metadata["tool_errors"][0]["kind"] == "exception" and released_all()
    # create raises: FAILED, and everything created is released
    s = await generate(
        args, sample_for("ok", {"track": {"create_kwargs": {"fail": True}}, "calculator": {}}), dict(PARAMS)
    )
    assert s.status == Sample.Status.FAILED and "create failed on purpose" in s.metadata["error"] and released_all()
    # the engine aborts
    CASES["abort"] = lambda t, b: [say(tok, call("track", {})), {"output_ids": [9, 9], "finish_type": "abort"}][t]
    s = await generate(args, sample_for("abort", kw), dict(PARAMS))
    assert s.status == Sample.Status.ABORTED and s.metadata["finish_reason"] == "engine_abort" and released_all()
    # the engine cannot be reached (retries spent)
    s = await generate(make_args(stack, tok, sglang_router_port=find_free_port()), sample_for("down", kw), dict(PARAMS))
    assert s.status == Sample.Status.FAILED and s.metadata["finish_reason"] == "engine_error" and released_all()
    bind_runtime(args, tokenizer=tok)  # back to the reachable router
    # the task is cancelled while a tool runs (rollout abort)
    CASES["cancel"] = lambda t, b: say(tok, call("track", {"mode": "sleep3"}))
    n0, sample = len(EVENTS), sample_for("cancel", kw)
    task = asyncio.ensure_future(generate(args, sample, dict(PARAMS)))
    while not task.done() and not any(e == "execute" for _, e, _ in EVENTS[n0:]):
        await asyncio.sleep(0.01)
    assert not task.done(), sample.metadata
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.05)
    assert sample.status == Sample.Status.ABORTED and released_all()
    # a tool that times out
    s = await generate(make_args(stack, tok, tool_call_timeout=0.1), sample_for("cancel", kw), dict(PARAMS))
    assert any(e["kind"] == "timeout" for e in s.metadata["tool_errors"]) and released_all()


async def test_tool_response_truncation(stack, tok):
    CASES["trunc"] = lambda t, b: [say(tok, call("calculator", {"expression": "7" * 150})), say(tok, "ok")][t]
    s = await generate(
        make_args(stack, tok, max_tool_response_tokens=8, tool_response_truncate_side="left"),
        sample_for("trunc", {"calculator": {}}),
        dict(PARAMS),
    )
    assert s.metadata["truncated_tool_responses"] == 1 and "...(truncated)" in s.response


def _write_data(tmp_path: Path, n: int) -> tuple[Path, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def tools_kwargs(i: int) -> dict:
        kw = {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": str(i + 1)}}}
        if i % 5 == 0:  # parquet turns the other rows' missing "calculator" into None
            kw["calculator"] = {"create_kwargs": {"note": "x"}}
        return kw

    rows = [
        {
            "prompt": [{"role": "user", "content": f"case:batch#{i} What is {i} + 1?"}],
            "label": str(i + 1),
            "extra_info": {"index": i, "tools_kwargs": tools_kwargs(i)},
        }
        for i in range(n)
    ]
    pq_path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pq_path)
    jl = tmp_path / "train.jsonl"
    jl.write_text("".join(json.dumps({"messages": r["prompt"], "label": r["label"]}) + "\n" for r in rows))
    return pq_path, jl


def test_tool_call_batch_case(stack, tok, tmp_path):
    """100 trajectories through the whole rollout (parquet, verl-style tools_kwargs), then JSONL messages."""
    from slime.rollout.data_source import DataSource
    from slime.cli.args import parse_args

    def batch(t, body):
        text = tok.decode(body["input_ids"])
        i = int(re.search(r"case:batch#(\d+)", text).group(1))
        answer = str(i + 1) if i % 2 == 0 else "0"
        return [
            say(tok, think("check") + call("calc_gsm8k_reward", {"answer": answer})),
            say(tok, think("done") + f"#### {answer}"),
        ][t]

    CASES["batch"] = batch
    pq_path, jl = _write_data(tmp_path, 25)
    argv = [
        "--hf-checkpoint",
        stack["model"],
        "--prompt-data",
        str(pq_path),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--tool-key",
        "extra_info.tools_kwargs",
        "--rollout-batch-size",
        "25",
        "--n-samples-per-prompt",
        "4",
        "--rollout-max-response-len",
        "512",
        "--rm-type",
        "gsm8k",
        "--sglang-router-ip",
        "127.0.0.1",
        "--sglang-router-port",
        str(stack["router"].port),
        "--rollout-function-path",
        "rollout_plugins.multi_turn.generate_rollout",
        "--tool-config-path",
        stack["config"],
        "--tool-reward-mode",
        "add",
        "--rollout-backend",
        "hf",
    ]
    args = parse_args(argv)
    bind_runtime(args, tokenizer=tok)
    from slime.utils.misc import load_function

    rollout = load_function(args.rollout_function_path)
    EVENTS.clear()
    out = rollout(args, 0, DataSource.from_args(args, tok))
    groups = out.samples if hasattr(out, "samples") else out
    samples = [s for g in groups for s in g]
    assert len(samples) == 100
    for s in samples:
        i = int(re.search(r"batch#(\d+)", str(s.prompt)).group(1))
        assert s.status == Sample.Status.COMPLETED and s.metadata["turns"] == 2, s.metadata
        assert s.metadata["tool_calls"] == {"calc_gsm8k_reward": 1} and s.metadata["template_drift"] is False
        good = i % 2 == 0
        expected = {"calc_gsm8k_reward": 1.0 if good else 0.0, **({"calculator": 0.0} if i % 5 == 0 else {})}
        assert s.metadata["tool_rewards"] == expected
        assert s.reward == pytest.approx(2.0 if good else -0.05)
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
    # JSONL with a `messages` list
    args = parse_args(argv[:2] + ["--prompt-data", str(jl), "--input-key", "messages"] + argv[6:])
    args.tool_key = None
    bind_runtime(args, tokenizer=tok)
    out = rollout(args, 1, DataSource.from_args(args, tok))
    samples = [s for g in (out.samples if hasattr(out, "samples") else out) for s in g]
    assert len(samples) == 100 and all(s.status == Sample.Status.COMPLETED for s in samples)
    # no tools_kwargs: every configured tool is created (gsm8k without ground truth scores 0)
    assert all(set(s.metadata["tool_rewards"]) == {"calc_gsm8k_reward", "calculator", "track"} for s in samples)
