"""slime.rollout.rm_hub: grading tables (expected values are what slime's own rm_hub returns for
the same inputs), dispatch (per-sample custom rm, metadata rm_type, --custom-rm-path,
batched), remote_rm against a loopback server, and the bounded symbolic checker."""

from __future__ import annotations

import asyncio
import random
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from aiohttp import web

from slime.rollout import rm_hub
from slime.rollout.rm_hub import UnknownRmType, async_rm, batched_async_rm, check_rm_type
from slime.rollout.rm_hub.symbolic import SymbolicChecker
from slime.utils.types import Sample

RAISES = "raises"

# Every expected value in this file was produced by running slime's rm_hub on the same input.
# (given answer, ground truth, slime's `math`, slime's `deepscaler`, slime's `dapo` score)
# `math` grades "so \boxed{given}", deepscaler "think</think> so \boxed{given}", dapo "Answer: given".
# dapo's labels must be integers: slime raises on the others, and so do we.
TABLE = [
    (r"\frac{1}{2}", r"\frac12", 1, 1, RAISES),
    ("0.5", "1/2", 1, 1, RAISES),
    (r"10\%", "10", 1, 1, -1.0),
    (r"\dfrac{3}{4}", "0.75", 1, 1, -1.0),
    ("2/4", "1/2", 0, 0, RAISES),  # unreduced fractions must be written like the ground truth
    ("-3", "-3.0", 1, 1, 1.0),
    (r"5 \text{ cm}", "5", 1, 1, 1.0),
    (r"\$5", "5", 1, 1, 1.0),
    ("x=2", "2", 1, 1, 1.0),
    ("1,000", "1000", 1, 1, 1.0),
    (r"\sqrt{2}/2", r"\frac{\sqrt2}{2}", 1, 1, RAISES),
    (r"\pi/2", r"\frac{\pi}{2}", 1, 1, RAISES),
    ("abc", "cab", 0, 0, RAISES),  # text is not a product of symbols
    ("42", "43", 0, 0, -1.0),
    ("x+1", "1+x", 1, 1, RAISES),
    (r"-\frac{1}{2}", "-0.5", 1, 1, -1.0),
    (r"-\dfrac{1}{2}", r"-\frac12", 1, 1, RAISES),
    ("-0.5", "1/2", 0, 0, RAISES),
    (r"\frac{-1}{2}", r"-\frac{1}{2}", 1, 1, RAISES),
    ("0.333", "1/3", 0, 0, RAISES),
    (r"\frac{1}{3}", "0.3333333", 0, 0, -1.0),
    (r"45^\circ", "45", 1, 1, 1.0),
    ("12 \\text{ inches}", "12", 1, 1, 1.0),
    ("10 meters", "10", 1, 1, 1.0),
    (r"\text{yes}", "Yes", 1, 1, RAISES),
    ("north", "North", 1, 1, RAISES),
    (r"2\sqrt{3}", r"\sqrt{12}", 1, 1, RAISES),
    ("(1,2)", "(1, 2)", 1, 1, RAISES),
    ("(1,2)", "(2,1)", 0, 0, RAISES),
    ("[1,2)", "(1,2)", 0, 0, RAISES),
    ("(1,2)", "[1,2]", 0, 0, RAISES),
    ("1, 2", "2, 1", 0, 0, -1.0),
    ("x^2+2x+1", "(x+1)^2", 1, 1, RAISES),
    ("1024", "2^{10}", 0, 0, RAISES),  # an integer ground truth needs an integer answer
    ("3.14", r"\pi", 0, 0, RAISES),
    ("7 3/4", r"7\frac{3}{4}", 1, 1, RAISES),
    ("1.5", r"\frac{3}{2}", 1, 1, RAISES),
    (".5", "0.5", 1, 1, -1.0),
    ("k = 5", "5", 1, 1, 1.0),
    ("5.00", "5", 1, 1, -1.0),
    ("2 million", "2000000", 0, 0, -1.0),
    ("0.10", r"10\%", 0, 0, RAISES),
    (r"10\%", "0.1", 0, 0, -1.0),
    (r"\frac{1}{2}\%", "0.5", 1, 1, -1.0),
    ("-2", "2", 0, 0, -1.0),
    ("1+i", "i+1", 1, 1, RAISES),
    ("3x", "x3", 1, 1, RAISES),
    (r"2\times 3", "6", 0, 0, -1.0),
    ("1e3", "1000", 1, 1, -1.0),
    (r"1{,}000", "1000", 1, 1, 1.0),
    (r"e^{i\pi}", "-1", 0, 0, -1.0),
    ("", "5", 0, 0, -1.0),
    (r"\pm 2", r"\pm2", 1, 1, RAISES),
    ("2, -2", r"\pm 2", 0, 0, RAISES),
    ("+2", "2", 1, 1, -1.0),
]

# Where we deliberately differ from slime: its LaTeX-to-text step reads \frac{x+1}{2} as x+1/2
# and drops the index of \sqrt[3]{2}; math-verify reads both correctly.
FIXED = [
    (r"\frac{x+1}{2}", "(x+1)/2", 1),
    ("x/2+1/2", r"\frac{x+1}{2}", 1),
    (r"\sqrt[3]{2}", r"\sqrt{2}", 0),
]


def args(**kw):
    base = dict(rm_type=None, custom_rm_path=None, group_rm=False, rm_url=None, reward_key=None)
    return SimpleNamespace(**{**base, **kw})


async def reward(rm_type, response, label, metadata=None):
    return await async_rm(args(rm_type=rm_type), Sample(response=response, label=label, metadata=metadata or {}))


@pytest.mark.parametrize("given,truth,math,deepscaler,dapo", TABLE)
async def test_math_table_agrees_with_slime(given, truth, math, deepscaler, dapo):
    boxed = "\\boxed{" + given + "}"
    assert await reward("math", "so " + boxed, truth) == math
    assert await reward("math", "so " + boxed, "\\boxed{" + truth + "}") == math  # boxed labels too
    assert await reward("deepscaler", "think</think> so " + boxed, truth) == deepscaler
    # slime's boxed_ prefix grades the boxed content with the rule, and math/deepscaler then
    # find no \boxed (or no </think>) in it: 0, as slime gives
    assert await reward("boxed_math", "x " + boxed, truth) == 0
    if dapo == RAISES:
        with pytest.raises(ValueError, match="--rm-type dapo: the label must be an integer"):
            await reward("dapo", "blah\nAnswer: " + given, truth)
    else:
        out = await reward("dapo", "blah\nAnswer: " + given, truth)
        assert out["score"] == dapo and out["acc"] is (dapo == 1.0)


@pytest.mark.parametrize("given,truth,expected", FIXED)
async def test_math_reads_latex_that_slime_misreads(given, truth, expected):
    assert await reward("math", "\\boxed{" + given + "}", truth) == expected


@pytest.mark.parametrize(
    "response,label,expected",
    [
        (r"\boxed{42}", "42", 0),  # no </think>: nothing graded
        (r"x###Response\boxed{42}", "42", 1),
        (r"\boxed{9}</think>\boxed{42}", "42", 1),  # only the part after </think>
        (r"</think>\boxed{42}", 42, 1),
        (r"</think>\boxed{42}", 42.0, 1),
        (r"</think>no box", "42", 0),
        (r"</think>\boxed{42}", "", 0),
    ],
)
async def test_deepscaler_cases(response, label, expected):
    assert await reward("deepscaler", response, label) == expected


@pytest.mark.parametrize(
    "response,label,expected",
    [
        (r"\fbox{42}", "42", 0),  # \fbox is found, but only \boxed{} is unwrapped (slime)
        (r"\boxed{42} and \boxed{43}", "43", 1),
        (r"\boxed{42}", 42, 1),
        (r"\boxed{42", "42", 0),
    ],
)
async def test_math_extraction_cases(response, label, expected):
    assert await reward("math", response, label) == expected


def test_dapo_compute_score_from_submodule():
    from slime.rollout.rm_hub.math_dapo_utils import compute_score, remove_boxed

    assert compute_score("work...\nAnswer: 1,000 dollars", "1000") == {"score": 1.0, "acc": True, "pred": "1000"}
    assert compute_score("Answer: 7\nAnswer: 8", 8) == {"score": 1.0, "acc": True, "pred": "8"}
    assert compute_score("no marker 8", "8") == {"score": -1.0, "acc": False, "pred": "[INVALID]"}
    assert compute_score("x" * 400 + "Answer: 8", "8")["acc"] is True  # only the last 300 characters count
    assert compute_score("Answer: 8" + "x" * 300, "8")["pred"] == "[INVALID]"
    assert compute_score(r"so \boxed{8}", "8", strict_box_verify=True) == {"score": 1.0, "acc": True, "pred": "8"}
    with pytest.raises(AssertionError, match="box error"):
        remove_boxed("8")


@pytest.mark.parametrize(
    "response,label,expected",
    [
        ("The Eiffel Tower", "eiffel tower", 1.0),
        ("Paris, France", "Paris", 2 / 3),
        ("yes", "no", 0),
        ("yes", "Yes.", 1.0),
        ("a cat sat on the mat", "the cat sat", 2 / 3),
        ("", "x", 0),
    ],
)
async def test_f1(response, label, expected):
    assert await reward("f1", response, label) == pytest.approx(expected)


async def test_boxed_prefix_grades_only_the_boxed_part():
    assert await reward("boxed_f1", r"long reasoning \boxed{Paris}", "paris") == 1.0
    assert await reward("boxed_f1", "Paris without a box", "paris") == 0


@pytest.mark.parametrize(
    "response,label,metadata,expected",
    [
        ("The answer is B.", "B", {}, 1.0),
        ("Answer: C", "B", {}, 0.0),
        ("<think>A</think> final answer: D", "D", {}, 1.0),
        ("I pick green", "green", {"choices": ["red", "green", "blue", "yellow"]}, 1.0),
        ("it is B", 1, {"choices": ["red", "green", "blue", "yellow"]}, 1.0),
        ("B is correct", "x", {"correct_letter": "b"}, 1.0),
        # E is no option here, but the label's text "e" occurs in the response: slime accepts it
        ("the answer is E", "E", {"choices": ["red", "green", "blue", "yellow"]}, 1.0),
        ("the answer is D", "B", {"choices": ["red", "green", "blue", "yellow"]}, 0.0),
        ("We ruled out A, then B, settled on C", "C", {}, 1.0),
    ],
)
async def test_gpqa(response, label, metadata, expected):
    assert await reward("gpqa", response, label, metadata) == expected


async def test_our_own_types_still_work():
    assert await reward("gsm8k", "3 + 4 = 7 #### 7", "Natalia ... #### 7") == 1.0
    assert await reward("gsm8k", "It is 1,200 dollars", "#### 1200") == 1.0
    assert await reward("gsm8k", "#### 8", "#### 7") == 0.0
    assert await reward("exact", " yes\n", "yes") == 1.0
    assert await reward("boxed", r"\boxed{\dfrac{1}{2}}", "0.5") == 1.0


async def test_random_is_zero_or_one_and_follows_the_seed():
    random.seed(1234)
    first = [await reward("random", "x", "y") for _ in range(20)]
    random.seed(1234)
    assert [await reward("random", "x", "y") for _ in range(20)] == first
    assert set(first) == {0, 1}


# ------------------------------------------------------------------ dispatch


async def rm_from_sample(args, sample, **kw):
    return {"who": "sample", **kw}


async def rm_from_args(args, sample, **kw):
    return {"who": "args", **kw}


async def batch_rm(args, samples, **kw):
    return [len(samples) * 10 + i for i in range(len(samples))]


async def batch_rm_short(args, samples, **kw):
    return [1]


async def test_precedence_sample_custom_then_args_custom_then_metadata_then_flag():
    a = args(rm_type="exact", custom_rm_path="tests.test_rm_hub.rm_from_args")
    s = Sample(response="x", label="x")
    s.custom_rm_path = "tests.test_rm_hub.rm_from_sample"
    assert await async_rm(a, s, extra=1) == {"who": "sample", "extra": 1}
    s.custom_rm_path = None
    assert await async_rm(a, s) == {"who": "args"}
    a.custom_rm_path = None
    s = Sample(response=r"</think>\boxed{3}", label="3", metadata={"rm_type": "deepscaler"})
    assert await async_rm(a, s) == 1  # metadata beats --rm-type exact
    assert await async_rm(a, Sample(response="3", label="3")) == 1.0  # --rm-type exact


async def test_batched_async_rm():
    samples = [
        Sample(response="a", label="a"),
        Sample(response="b", label="c"),
        Sample(response=r"\boxed{1/2}", label="0.5", metadata={"rm_type": "math"}),
    ]
    assert await batched_async_rm(args(rm_type="exact"), samples) == [1.0, 0.0, 1]
    # --custom-rm-path is called once with the whole list (slime's batch mode)
    assert await batched_async_rm(args(custom_rm_path="tests.test_rm_hub.batch_rm"), samples) == [30, 31, 32]
    with pytest.raises(ValueError, match=r"batch_rm_short.*one reward per sample: got 1 rewards for 3 samples"):
        await batched_async_rm(args(custom_rm_path="tests.test_rm_hub.batch_rm_short"), samples)


async def test_unknown_or_missing_type_is_rejected():
    with pytest.raises(ValueError, match="--rm-type 'nope': unknown reward type"):
        await reward("nope", "x", "x")
    with pytest.raises(NotImplementedError):  # slime's exception type, for code that catches it
        await reward("boxed_nope", "x", "x")
    with pytest.raises(UnknownRmType):
        check_rm_type("nope")
    with pytest.raises(ValueError, match=r"metadata\['rm_type'\] 'bad'"):
        await reward(None, "x", "x", {"rm_type": "bad"})
    with pytest.raises(ValueError, match="no reward: set --rm-type"):
        await reward(None, "x", "x")


def test_check_rm_type_at_start_up(monkeypatch):
    for ok in (
        None,
        "",
        "math",
        "deepscaler",
        "dapo",
        "f1",
        "gpqa",
        "random",
        "remote_rm",
        "boxed_math",
        "gsm8k",
        "exact",
        "boxed",
    ):
        check_rm_type(ok)
    for bad in ("nope", "boxed_nope", "Math"):
        with pytest.raises(ValueError, match=f"--rm-type '{bad}': unknown reward type"):
            check_rm_type(bad)
    with pytest.raises(ValueError, match="--rm-type remote_rm needs --rm-url"):
        check_rm_type("remote_rm", args=args(rm_type="remote_rm"))
    check_rm_type("remote_rm", args=args(rm_url="http://127.0.0.1:1/rm"))
    monkeypatch.setattr(rm_hub, "ifbench_available", lambda: None)
    with pytest.raises(ValueError, match="--rm-type ifbench needs IFBench's instruction checkers.*if-verifiable"):
        check_rm_type("ifbench")
    monkeypatch.setattr(rm_hub, "ifbench_available", lambda: "evaluation_lib")
    check_rm_type("ifbench")


# ------------------------------------------------------------------ remote_rm


async def test_remote_rm_posts_prompt_response_label():
    seen = []

    async def handle(request):
        body = await request.json()
        seen.append(body)
        return web.json_response({"score": 1.0 if body["response"] == body["label"] else 0.0})

    app = web.Application()
    app.router.add_post("/rm", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        a = args(rm_type="remote_rm", rm_url=f"http://127.0.0.1:{port}/rm")
        samples = [
            Sample(prompt=[{"role": "user", "content": "q"}], response="4", label="4"),
            Sample(prompt="q2", response="5", label="4"),
        ]
        assert await batched_async_rm(a, samples) == [{"score": 1.0}, {"score": 0.0}]
        assert sorted(seen, key=lambda b: b["response"]) == [
            {"prompt": [{"role": "user", "content": "q"}], "response": "4", "label": "4"},
            {"prompt": "q2", "response": "5", "label": "4"},
        ]
        assert samples[0].prompt  # unchanged
    finally:
        await runner.cleanup()


async def test_remote_rm_without_url_names_the_flag():
    with pytest.raises(ValueError, match="--rm-url"):
        await async_rm(args(rm_type="remote_rm"), Sample(response="x", label="y"))


# ------------------------------------------------------------------ ifbench

FAKE_EVALUATION_LIB = """
class _MaxWords:
    def __init__(self, instruction_id):
        self.id = instruction_id
    def build_description(self, *, num_words=None, prompt=None):
        if num_words is not None:
            self.n = num_words
        if prompt is not None:
            self.prompt = prompt
    def get_instruction_args(self):
        return {"num_words": self.n}
    def check_following(self, value):
        return len(value.split()) <= self.n

class _EchoesPrompt(_MaxWords):
    def get_instruction_args(self):
        return {"prompt": None}
    def check_following(self, value):
        return self.prompt in value

class instructions_registry:
    INSTRUCTION_DICT = {"length:max_words": _MaxWords, "copy:prompt": _EchoesPrompt}
"""


@pytest.fixture
def fake_ifbench(tmp_path, monkeypatch):
    """IFBench's `evaluation_lib` layout (a clone on PYTHONPATH), with two toy checkers."""
    from slime.rollout.rm_hub import ifbench

    (tmp_path / "evaluation_lib.py").write_text(FAKE_EVALUATION_LIB)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "evaluation_lib", raising=False)
    ifbench._registry.cache_clear()
    yield
    ifbench._registry.cache_clear()
    sys.modules.pop("evaluation_lib", None)


async def test_ifbench_with_checkers_on_path(fake_ifbench):
    md = {
        "instruction_id_list": ["length:max_words", "copy:prompt"],
        "kwargs": [{"num_words": 4}, {}],
        "prompt_text": "hi",
        "record_id": 3,
    }
    check_rm_type("ifbench")
    assert await reward("ifbench", "hi there", None, md) == 1.0
    assert await reward("ifbench", "hi there you all now", None, md) == 0.0  # 5 words
    assert await reward("ifbench", "hello", None, md) == 0.0  # prompt not echoed
    assert await reward("ifbench", "   ", None, md) == 0.0
    assert await reward("ifbench", "hi", None, {}) == 0.0  # no instructions: nothing to follow
    # one kwargs dict is shared by every instruction; None values are dropped
    shared = {"instruction_id_list": ["length:max_words"], "kwargs": {"num_words": 1, "other": None}}
    assert await reward("ifbench", "one", None, shared) == 1.0
    with pytest.raises(ValueError, match="'nope:x', which is not an IFBench instruction"):
        await reward("ifbench", "x", None, {"instruction_id_list": ["nope:x"]})


async def test_ifbench_without_checkers_says_what_to_install(monkeypatch):
    from slime.rollout.rm_hub import ifbench

    monkeypatch.setattr(ifbench, "ifbench_available", lambda: None)
    ifbench._registry.cache_clear()
    try:
        with pytest.raises(ImportError, match="pip install if-verifiable"):
            await reward("ifbench", "x", None, {"instruction_id_list": ["length:max_words"]})
    finally:
        ifbench._registry.cache_clear()


# ------------------------------------------------------------------ bounded symbolic checker


def test_symbolic_checker_works_from_threads_and_gives_math_verify_verdicts():
    checker = SymbolicChecker(timeout=20, workers=2)
    try:
        pairs = [
            (r"\frac{1}{2}", "0.5", True),
            (r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}", True),
            ("x+1", "1+x", True),
            ("2", "3", False),
            (r"\pi", "3.14", False),
        ] * 3
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda p: checker.equivalent(p[0], p[1]), pairs))
        assert got == [p[2] for p in pairs]
        assert checker.timeouts == 0
    finally:
        checker.close()


def test_symbolic_checker_kills_a_worker_that_misses_the_deadline():
    never_answers = [sys.executable, "-c", "import sys\nfor _ in sys.stdin: pass"]
    checker = SymbolicChecker(timeout=0.2, workers=1, start_timeout=0.0, command=never_answers)
    try:
        done = []
        t = threading.Thread(target=lambda: done.append(checker.equivalent("1", "1")))
        t.start()
        t.join()
        assert done == [False] and checker.timeouts == 1
        assert checker.equivalent("1", "1") is False and checker.timeouts == 2  # a new worker was started
    finally:
        checker.close()


def test_adversarial_answer_is_cut_off_and_the_checker_recovers():
    checker = SymbolicChecker(timeout=1, workers=1)
    try:
        assert checker.equivalent("1", "1.0") is True  # worker started
        assert checker.equivalent(r"\sin(x)^{2^{30}}", "1") is False
        assert checker.equivalent(r"\frac{1}{4}", "0.25") is True
    finally:
        checker.close()


async def test_grading_does_not_block_the_event_loop():
    ticks = 0

    async def ticker(stop):
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    stop = asyncio.Event()
    task = asyncio.create_task(ticker(stop))
    results = await asyncio.gather(*(reward("math", r"\boxed{\sqrt{8}}", r"2\sqrt{2}") for _ in range(8)))
    stop.set()
    await task
    assert results == [1] * 8 and ticks > 0


async def test_a_built_in_rule_that_raises_fails_its_sample_alone_whether_called_inline_or_not():
    """The reward step calls built-in rules inline (no task per sample): a rule that raises, or a sample whose
    reward cannot even be set up, is still a FAILED sample with `reward_error`, and the others are rewarded."""
    from types import SimpleNamespace

    from slime.rollout.reward_step import reward_each
    from slime.utils.types import Sample

    class BadLabel:
        def __str__(self):
            raise RuntimeError("label cannot be read")

    from slime.rollout.flags import RolloutConfig

    args = SimpleNamespace(rm_type="exact", custom_rm_path=None, reward_timeout=5.0, reward_key=None)
    config = RolloutConfig(rm_type="exact", reward_timeout=5.0)
    good = Sample(index=0, response=" x ", label="x", status=Sample.Status.COMPLETED)
    bad = Sample(index=1, response="x", label=BadLabel(), status=Sample.Status.COMPLETED)
    unknown = Sample(index=2, response="x", label="x", status=Sample.Status.COMPLETED, metadata={"rm_type": "nope"})
    # the rule's set-up raises (a boxed answer looked for in no response at all)
    no_text = Sample(
        index=3, response=None, label="x", status=Sample.Status.COMPLETED, metadata={"rm_type": "boxed_exact"}
    )
    await reward_each(config, args, [good, bad, unknown, no_text])
    assert good.reward == 1.0 and good.status == Sample.Status.COMPLETED
    for s in (bad, unknown, no_text):
        assert s.status == Sample.Status.FAILED and s.metadata["failure_reason"] == "reward_error"
