"""Partial rollout, over-provisioning and bounded abort, against an abort-aware scripted engine behind
the real sglang-router.

The engine's script knows every prompt: "short" prompts answer at once (once every "long" request is
held, so which groups finish first is fixed), "long" ones sample `K` tokens and hold until they are
aborted (answering with the tokens so far, as SGLang does), or, once released, sample the rest up to
`L` tokens. Response token at position p is 300 + p with log-prob -(p + 1) / 100, so every token,
log-prob and mask below is known exactly.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from typing import Any

import pytest

from slime.cli.args import ArgError, parse_args
from slime.fleet.router import Router
from slime.rollout import partial_rollout as partial
from slime.rollout.data_source import DataSource
from slime.rollout.sglang_rollout import generate_rollout
from slime.rollout.sample_hooks import set_current_rollout_id
from slime.testing.runtime import bind_runtime
from slime.testing.scripted_engine import ScriptedEngine
from slime.tools.example_tools import CalculatorTool
from slime.utils.types import Sample
from tests.conftest import native_tools_yaml

K, L, BUDGET = 3, 10, 16  # tokens before the abort, full long response, --rollout-max-response-len


def lp(pos: int) -> float:
    return -(pos + 1) / 100


class Plan:
    """What the engine does this test (the script delegates to the current plan)."""

    def __init__(self, kinds: dict[tuple[int, ...], str], hold: int = 0, finish_long: bool = False, deaf: bool = False):
        self.kinds, self.hold, self.finish_long, self.deaf = kinds, hold, finish_long, deaf
        self.holding = 0
        self.release = threading.Event()  # lets a deaf request end when the test is over
        self._all_held: asyncio.Event | None = None  # created on the engine's loop

    def all_held(self) -> asyncio.Event:
        if self._all_held is None:
            self._all_held = asyncio.Event()
        return self._all_held

    def lookup(self, ids: list[int]) -> tuple[str, int]:
        for prompt, kind in self.kinds.items():
            if tuple(ids[: len(prompt)]) == prompt:
                return kind, len(prompt)
        raise AssertionError(f"unknown prompt {ids}")

    @staticmethod
    def answer(start: int, end: int, finish: str) -> dict[str, Any]:
        return {
            "output_ids": [300 + p for p in range(start, end)],
            "log_probs": [lp(p) for p in range(start, end)],
            "finish_type": finish,
            "text": "".join(f"<{p}>" for p in range(start, end)),
        }

    async def __call__(self, body: dict[str, Any], aborted: asyncio.Event) -> dict[str, Any]:
        ids, max_new = body["input_ids"], body["sampling_params"]["max_new_tokens"]
        kind, prompt_len = self.lookup(ids)
        pos = len(ids) - prompt_len
        if kind == "short":
            if self.hold:
                await asyncio.wait_for(self.all_held().wait(), 20)
            return {"output_ids": [200, 201, 202], "finish_type": "stop", "text": "s"}
        if kind == "flaky" and pos == 0:  # the engine aborts it on its own (e.g. a weight update)
            return self.answer(0, K, "abort")
        if self.finish_long or kind == "flaky":
            end = min(L, pos + max_new)
            return self.answer(pos, end, "stop" if end == L else "length")
        self.holding += 1
        if self.holding == self.hold:
            self.all_held().set()
        if self.deaf:  # ignores the abort
            await asyncio.to_thread(self.release.wait, 30)
            return self.answer(pos, pos + K, "stop")
        await asyncio.wait_for(aborted.wait(), 30)
        return self.answer(pos, pos + K, "abort")


class Engine:
    plan: Plan | None = None

    async def __call__(self, body, aborted):
        return await self.plan(body, aborted)


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    script = Engine()
    engine = ScriptedEngine(script, str(tiny_model_dir)).start()
    router = Router().start()
    router.add_worker(engine.url)
    yield router, engine, script
    if isinstance(script.plan, Plan):
        script.plan.release.set()
    router.stop()
    engine.stop()


@pytest.fixture(scope="module")
def tok(tiny_tokenizer):
    return tiny_tokenizer  # the session's (tests/conftest.py): loaded once


def set_version(engine: ScriptedEngine, version: str) -> None:
    req = urllib.request.Request(
        f"{engine.url}/update_weights_from_disk",
        method="POST",
        data=json.dumps({"weight_version": version}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert json.loads(r.read())["success"]


def setup(tmp_path, cluster, tok, tiny_model_dir, kinds: list[str], *extra: str, **plan_kw):
    """Args, data source (one prompt per kind, in order), bound runtime and plan."""
    router, engine, script = cluster
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        "".join(json.dumps({"input": f"{kind} prompt {i}", "label": "x"}) + "\n" for i, kind in enumerate(kinds))
    )
    args = parse_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(data),
            "--label-key",
            "label",
            "--sglang-router-ip",
            router.host,
            "--sglang-router-port",
            str(router.port),
            "--rm-type",
            "exact",
            "--n-samples-per-prompt",
            "2",
            "--rollout-max-response-len",
            str(BUDGET),
            *extra,
        ]
    )
    src = DataSource.from_args(args, tok)
    bind_runtime(args, tokenizer=tok, engine_urls=[engine.url])
    script.plan = Plan({tuple(p.tokens): k for p, k in zip(src.prompts, kinds)}, **plan_kw)
    set_version(engine, "1")
    return args, src, engine, script


def indices(groups) -> list[int]:
    return sorted(s.index for g in groups for s in g)


def first_rollout(args, src, engine, script):
    """Rollout 0: 2 short groups kept, 2 long groups (K tokens each) aborted."""
    out = generate_rollout(args, 0, src)
    assert [g[0].group_index for g in out.samples] == [0, 1]
    assert src.get_buffer_length() == 2 and [g[0].group_index for g in src.buffer] == [2, 3]
    assert indices(out.samples) + indices(src.buffer) == list(range(8))  # every sample once: in or out
    return out


@pytest.mark.parametrize("mask_offpolicy,new_version", [(False, "2"), (True, "2"), (True, "1")])
def test_continuation_is_exact(tmp_path, cluster, tok, tiny_model_dir, mask_offpolicy, new_version):
    extra = ["--mask-offpolicy-in-partial-rollout"] if mask_offpolicy else []
    args, src, engine, script = setup(
        tmp_path,
        cluster,
        tok,
        tiny_model_dir,
        ["short", "short", "long", "long"],
        "--partial-rollout",
        "--rollout-batch-size",
        "2",
        "--over-sampling-batch-size",
        "4",
        *extra,
        hold=4,
    )
    out = first_rollout(args, src, engine, script)
    assert {
        k: out.metrics[k] for k in ("rollout/aborted_samples", "rollout/continued_samples", "rollout/wasted_tokens")
    } == {"rollout/aborted_samples": 4, "rollout/continued_samples": 0, "rollout/wasted_tokens": 0}
    assert out.metrics["perf/abort_time"] > 0
    for s in (s for g in src.buffer for s in g):
        assert s.status == Sample.Status.ABORTED and s.response_length == K
        assert s.tokens[s.prompt_length :] == [300, 301, 302] and s.rollout_log_probs == [lp(p) for p in range(K)]
        assert s.loss_mask == [1] * K and s.reward is None
        assert s.metadata["weight_versions"] == ["1"] and s.metadata["start_rollout_id"] == 0
    src.load_state_dict(json.loads(json.dumps(src.state_dict())))  # a save/resume in between loses nothing
    # rollout 1: new weights, the long groups are let finish; only the buffered groups are handed out
    set_version(engine, new_version)
    script.plan.finish_long = True
    args.over_sampling_batch_size = 2
    n0 = len(engine.requests)
    out = generate_rollout(args, 1, src)
    assert [g[0].group_index for g in out.samples] == [2, 3] and src.get_buffer_length() == 0
    assert out.metrics["rollout/continued_samples"] == 4 and out.metrics["rollout/aborted_samples"] == 0
    assert out.metrics["rollout/wasted_tokens"] == 0 and out.metrics["perf/abort_time"] == 0.0
    sent = engine.requests[n0:]
    assert len(sent) == 4 and all(r["sampling_params"]["max_new_tokens"] == BUDGET - K for r in sent)
    for s in (s for g in out.samples for s in g):
        prompt = tok(s.prompt, add_special_tokens=False)["input_ids"]
        assert s.prompt_length == len(prompt) and prompt + [300, 301, 302] in [r["input_ids"] for r in sent]
        assert s.tokens == prompt + [300 + p for p in range(L)] and s.response_length == L
        assert s.rollout_log_probs == [lp(p) for p in range(L)]
        assert s.response == "".join(f"<{p}>" for p in range(L))
        assert s.status == Sample.Status.COMPLETED and s.reward == 0.0
        off = mask_offpolicy and new_version != "1"
        assert s.loss_mask == [0 if off else 1] * K + [1] * (L - K)
        assert s.metadata["weight_versions"] == s.weight_versions == ["1", new_version]
        assert [(x["start"], x["end"], x["rollout_id"]) for x in s.metadata["segments"]] == [(0, K, 0), (K, L, 1)]
        assert s.metadata["continuations"] == 1 and s.metadata["start_rollout_id"] == 0
        assert partial.token_weight_versions(s) == ["1"] * K + [new_version] * (L - K)


def test_without_partial_rollout_regenerates_and_counts_waste(tmp_path, cluster, tok, tiny_model_dir):
    args, src, engine, script = setup(
        tmp_path,
        cluster,
        tok,
        tiny_model_dir,
        ["short", "short", "long", "long"],
        "--rollout-batch-size",
        "2",
        "--over-sampling-batch-size",
        "4",
        hold=4,
    )
    out = first_rollout(args, src, engine, script)
    assert out.metrics["rollout/aborted_samples"] == 4 and out.metrics["rollout/wasted_tokens"] == 4 * K
    for s in (s for g in src.buffer for s in g):
        assert s.status == Sample.Status.PENDING and s.response_length == 0 and s.weight_versions == []
        assert s.tokens == tok(s.prompt, add_special_tokens=False)["input_ids"]
    script.plan.finish_long = True
    args.over_sampling_batch_size = 2
    n0 = len(engine.requests)
    out = generate_rollout(args, 1, src)
    assert out.metrics["rollout/continued_samples"] == 0
    sent = engine.requests[n0:]
    assert all(r["sampling_params"]["max_new_tokens"] == BUDGET for r in sent)
    for s in (s for g in out.samples for s in g):
        prompt = tok(s.prompt, add_special_tokens=False)["input_ids"]
        assert prompt in [r["input_ids"] for r in sent]
        assert s.tokens == prompt + [300 + p for p in range(L)] and s.loss_mask == [1] * L
        assert "continuations" not in s.metadata and s.metadata["weight_versions"] == ["1"]


def test_abort_timeout_bounds_the_wait_on_an_engine_ignoring_the_abort(tmp_path, cluster, tok, tiny_model_dir):
    args, src, engine, script = setup(
        tmp_path,
        cluster,
        tok,
        tiny_model_dir,
        ["short", "short", "long", "long"],
        "--partial-rollout",
        "--rollout-batch-size",
        "2",
        "--over-sampling-batch-size",
        "4",
        "--abort-timeout",
        "0.5",
        hold=4,
        deaf=True,
    )
    try:
        out = first_rollout(args, src, engine, script)
    finally:
        script.plan.release.set()
    # the deaf requests would answer only when released (up to 30 s): the rollout did not wait for them
    assert 0.5 <= out.metrics["perf/abort_time"] < 30
    assert out.metrics["rollout/aborted_samples"] == 4 and out.metrics["rollout/wasted_tokens"] == 0
    for s in (s for g in src.buffer for s in g):  # cancelled: back as handed out (a fresh prompt)
        assert s.status == Sample.Status.PENDING and s.response_length == 0
        assert s.tokens == tok(s.prompt, add_special_tokens=False)["input_ids"]


def test_group_aborted_by_the_engine_is_continued_in_the_same_rollout(tmp_path, cluster, tok, tiny_model_dir):
    args, src, engine, script = setup(
        tmp_path, cluster, tok, tiny_model_dir, ["flaky", "short"], "--partial-rollout", "--rollout-batch-size", "2"
    )
    out = generate_rollout(args, 0, src)
    assert [g[0].group_index for g in out.samples] == [0, 1] and src.get_buffer_length() == 0
    assert out.metrics["rollout/aborted_samples"] == 2 and out.metrics["rollout/continued_samples"] == 2
    for s in out.samples[0]:
        assert s.tokens[s.prompt_length :] == [300 + p for p in range(L)] and s.loss_mask == [1] * L
        assert s.rollout_log_probs == [lp(p) for p in range(L)] and s.metadata["continuations"] == 1
        assert s.status == Sample.Status.COMPLETED


def test_over_provisioning_returns_the_target_and_keeps_the_rest(tmp_path, cluster, tok, tiny_model_dir):
    """6 groups in flight for a target of 2: exactly 2 returned, 4 in the buffer, every prompt counted once;
    the next rollout serves the buffer first and loses nothing."""
    kinds = ["short", "short", "long", "long", "long", "long"]
    args, src, engine, script = setup(
        tmp_path,
        cluster,
        tok,
        tiny_model_dir,
        kinds,
        "--partial-rollout",
        "--rollout-batch-size",
        "2",
        "--over-sampling-batch-size",
        "6",
        hold=8,
    )
    out = generate_rollout(args, 0, src)
    assert len(out.samples) == 2 and src.group_counter == 6 and src.get_buffer_length() == 4
    assert indices(out.samples) + indices(src.buffer) == list(range(12))
    assert out.metrics["rollout/aborted_samples"] == 8
    script.plan.finish_long = True
    args.rollout_batch_size = args.over_sampling_batch_size = 4
    out2 = generate_rollout(args, 1, src)
    assert src.group_counter == 6 and src.get_buffer_length() == 0
    assert indices(out.samples) + indices(out2.samples) == list(range(12))
    assert out2.metrics["rollout/continued_samples"] == 8


# ---- units -------------------------------------------------------------------------------------
def test_units_continuation_input_and_offpolicy_mask_without_versions():
    s = Sample(tokens=[1, 2, 3, 300, 301], response_length=2, status=Sample.Status.ABORTED, loss_mask=[1, 1])
    ids, params = partial.continuation_input(s, {"max_new_tokens": 16, "temperature": 1.0})
    assert ids == [1, 2, 3, 300, 301] and params == {"max_new_tokens": 14, "temperature": 1.0}
    # engines reporting no version: segments of an earlier rollout are off-policy (slime's rule)
    s.metadata = {
        "weight_versions": [None, None, None],
        "segments": [
            {"start": 0, "end": 1, "rollout_id": 0},
            {"start": 1, "end": 2, "rollout_id": 0},
            {"start": 2, "end": 4, "rollout_id": 1},
        ],
    }
    s.response_length, s.loss_mask = 4, [1, 1, 1, 1]
    assert partial.mask_offpolicy(s) == 2 and s.loss_mask == [0, 0, 1, 1]
    assert partial.mask_offpolicy(s) == 0  # idempotent


def test_bad_input_errors(tmp_path, tiny_model_dir):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"input": "hi"}) + "\n")
    base = ["--rollout-backend", "hf", "--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(data)]
    with pytest.raises(ArgError) as e:
        parse_args(
            base
            + ["--partial-rollout", "--custom-generate-function-path", "tests.test_rollout_scripted.broken_generate"]
        )
    msg = str(e.value)
    assert msg.startswith(
        "--partial-rollout: --custom-generate-function-path "
        "'tests.test_rollout_scripted.broken_generate' cannot continue"
    )
    assert "broken_generate.supports_partial_rollout = True" in msg
    with pytest.raises(ArgError, match="^--custom-generate-function-path 'no.such.fn': cannot import"):
        parse_args(base + ["--partial-rollout", "--custom-generate-function-path", "no.such.fn"])
    for path in ("rollout_plugins.multi_turn.generate", "slime.rollout.sglang_rollout.generate"):
        parse_args(base + ["--partial-rollout", "--custom-generate-function-path", path])
    parse_args(base + ["--custom-generate-function-path", "tests.test_rollout_scripted.broken_generate"])
    with pytest.raises(ArgError, match=r"^--max-staleness: must be >= 0 weight versions, got -1"):
        parse_args(base + ["--max-staleness", "-1"])
    with pytest.raises(ArgError, match=r"^--abort-timeout: must be >= 0"):
        parse_args(base + ["--abort-timeout", "-2"])
    args = parse_args(base + ["--max-staleness", "2"])
    assert args.max_staleness == 2 and args.abort_timeout == 5.0 and not args.mask_offpolicy_in_partial_rollout


# ---- multi-turn --------------------------------------------------------------------------------
TOOLS_YAML = native_tools_yaml(
    (
        "tests.test_partial_rollout.GatedCalculator",
        "calculator",
        "arithmetic",
        {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    )
)
IM_END = 151645


class GatedCalculator(CalculatorTool):
    """The calculator, held until the test opens `GATE` (a tool call in flight during an abort)."""

    async def execute(self, instance_id, parameters, **kw):
        if GATE.get("started") is not None:
            GATE["started"].set()
            await GATE["go"].wait()
        return await super().execute(instance_id, parameters, **kw)


GATE: dict[str, asyncio.Event] = {}  # set by the one test that holds the tool


class TurnScript:
    """Turn 1: a calculator call; turn 2: `K` ids then hold until aborted, or (released) the rest."""

    def __init__(self, tok):
        self.tok, self.release = tok, False
        self.holding = threading.Event()
        self.turn2_input: list[int] | None = None  # what the held turn-2 request was sent
        call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 + 4"}}\n</tool_call>'
        self.turn1 = tok.encode(call, add_special_tokens=False) + [IM_END]
        self.turn2 = tok.encode("The answer is 7", add_special_tokens=False) + [IM_END]

    async def __call__(self, body, aborted):
        ids = body["input_ids"]
        if "<tool_response>" not in self.tok.decode(ids, skip_special_tokens=False):
            return {
                "output_ids": self.turn1,
                "finish_type": "stop",
                "log_probs": [-0.5 - 0.001 * i for i in range(len(self.turn1))],
            }
        if self.release:
            if self.turn2_input is None:
                self.turn2_input = list(ids)
            done = len(ids) - len(self.turn2_input)
            rest = self.turn2[done:]
            return {
                "output_ids": rest,
                "finish_type": "stop",
                "weight_version": "2",
                "log_probs": [-0.7 - 0.001 * (done + i) for i in range(len(rest))],
            }
        self.turn2_input = list(ids)
        self.holding.set()
        await asyncio.wait_for(aborted.wait(), 30)
        return {"output_ids": self.turn2[:K], "finish_type": "abort", "log_probs": [-0.7 - 0.001 * i for i in range(K)]}


@pytest.fixture
def multi_turn_stack(tmp_path, tok, cluster, runtime_closed_on_the_test_loop):
    """The module's router and engine, answering with a `TurnScript`."""
    from slime.tools.flags import tool_defaults

    router, engine, holder = cluster
    script = holder.plan = TurnScript(tok)
    set_version(engine, "1")
    cfg = tmp_path / "tools.yaml"
    cfg.write_text(TOOLS_YAML)
    args = multi_turn_args(tool_defaults(), router, cfg)
    rt = bind_runtime(args, tokenizer=tok, engine_urls=[engine.url])
    yield script, engine, args, rt
    GATE.clear()


MT_PARAMS = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "max_new_tokens": 200,
    "skip_special_tokens": False,
    "no_stop_trim": True,
}


async def test_multi_turn_tool_call_in_flight_finishes_then_resumes_at_the_next_turn(multi_turn_stack):
    from rollout_plugins.multi_turn import generate

    script, engine, args, rt = multi_turn_stack
    script.release = True
    GATE.update(started=asyncio.Event(), go=asyncio.Event())
    set_current_rollout_id(0)
    sample = Sample(index=0, prompt=[{"role": "user", "content": "What is 3 + 4?"}], metadata={})
    task = asyncio.ensure_future(generate(args, sample, dict(MT_PARAMS)))
    await asyncio.wait_for(GATE["started"].wait(), 20)
    gate = rt.client.gate
    gate.close()  # the rollout aborts while the tool runs
    await rt.client.abort_all()
    GATE["go"].set()
    sample = await task
    gate.open()
    assert sample.status == Sample.Status.ABORTED and sample.metadata["finish_reason"] == "rollout_abort"
    assert sample.metadata["multi_turn_resume"]["aborted_turn"] is False
    first, n1 = list(sample.tokens), len(script.turn1)
    spans = [(x["turn"], x["role"]) for x in sample.metadata["turn_spans"]]
    assert spans == [(1, "assistant"), (1, "tool")]  # the tool call finished and its turn was appended
    assert "<tool_response>\n7\n</tool_response>" in tok_decode(rt, first)
    GATE.clear()
    set_current_rollout_id(1)
    n0 = len(engine.requests)
    sample = await generate(args, sample, dict(MT_PARAMS))
    [req] = engine.requests[n0:]
    assert req["input_ids"] == first and sample.tokens == first + script.turn2
    assert sample.status == Sample.Status.COMPLETED and sample.metadata["turns"] == 2
    delta = len(first) - sample.prompt_length - n1
    assert sample.loss_mask == [1] * n1 + [0] * delta + [1] * len(script.turn2)
    assert sample.metadata["tool_calls"] == {"calculator": 1} and sample.metadata["continuations"] == 1


def tok_decode(rt, ids):
    return rt.tokenizer.decode(ids, skip_special_tokens=False)


async def test_multi_turn_resumes_inside_the_aborted_turn(multi_turn_stack):
    """An engine turn aborted after K tokens keeps them; the next rollout resumes inside that turn.
    Tokens, loss mask (tool turn 0), log-probs and turn spans stay exactly aligned."""
    from rollout_plugins.multi_turn import generate

    script, engine, args, rt = multi_turn_stack
    set_current_rollout_id(0)
    sample = Sample(index=0, prompt=[{"role": "user", "content": "What is 3 + 4?"}], metadata={})
    task = asyncio.ensure_future(generate(args, sample, dict(MT_PARAMS)))
    assert await asyncio.to_thread(script.holding.wait, 20)
    await rt.client.abort_all()  # as a rollout that met its target does
    sample = await task
    assert sample.status == Sample.Status.ABORTED and sample.metadata["finish_reason"] == "engine_abort"
    first, prompt_len = list(sample.tokens), sample.prompt_length
    assert first == script.turn2_input + script.turn2[:K]
    # the next rollout (new weights): resumed inside turn 2, from every token so far
    script.release = True
    set_current_rollout_id(1)
    n0 = len(engine.requests)
    sample = await generate(args, sample, dict(MT_PARAMS))
    [req] = engine.requests[n0:]
    assert req["input_ids"] == first
    assert req["sampling_params"]["max_new_tokens"] == 200 - (len(first) - prompt_len)
    assert sample.status == Sample.Status.COMPLETED and sample.metadata["continuations"] == 1
    assert sample.tokens == script.turn2_input + script.turn2
    n1, n2 = len(script.turn1), len(script.turn2)
    delta = len(script.turn2_input) - prompt_len - n1  # the tool turn's template tokens
    assert sample.loss_mask == [1] * n1 + [0] * delta + [1] * n2
    assert sample.rollout_log_probs == pytest.approx(
        [-0.5 - 0.001 * i for i in range(n1)] + [0.0] * delta + [-0.7 - 0.001 * i for i in range(n2)]
    )
    spans = [(x["turn"], x["role"], x["start"], x["end"]) for x in sample.metadata["turn_spans"]]
    assert spans == [
        (1, "assistant", 0, n1),
        (1, "tool", n1, n1 + delta),
        (2, "assistant", n1 + delta, sample.response_length),
    ]
    assert sample.metadata["weight_versions"] == sample.weight_versions == ["1", "1", "2"]
    assert [(x["start"], x["end"], x["rollout_id"]) for x in sample.metadata["segments"]] == [
        (0, n1, 0),
        (n1 + delta, n1 + delta + K, 0),
        (n1 + delta + K, sample.response_length, 1),
    ]
    assert sample.metadata["turns"] == 2 and "multi_turn_resume" not in sample.metadata
    assert "The answer is 7" in sample.response and sample.metadata["tool_calls"] == {"calculator": 1}
    # --mask-offpolicy-in-partial-rollout: the tokens sampled by version 1 are masked
    assert partial.mask_offpolicy(sample) == n1 + K
    assert sample.loss_mask == [0] * (n1 + delta + K) + [1] * (n2 - K)


def multi_turn_args(defaults, router, cfg):
    import argparse

    return argparse.Namespace(
        **{
            **defaults,
            "sglang_router_ip": "127.0.0.1",
            "sglang_router_port": router.port,
            "hf_checkpoint": None,
            "rollout_max_response_len": 200,
            "rollout_max_context_len": None,
            "sglang_server_concurrency": 8,
            "request_timeout": 30.0,
            "request_max_retries": 0,
            "tool_config_path": str(cfg),
            "rm_type": None,
            "custom_rm_path": None,
            "group_rm": False,
            "partial_rollout": True,
            "rollout_num_engines": 1,
        }
    )
