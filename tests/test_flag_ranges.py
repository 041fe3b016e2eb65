"""Every numeric flag's range, refused by name before anything starts (slime/cli/flag_ranges.py): each
entry of the table with values outside it (hypothesis), every float flag with NaN/inf, token ids past
the model's vocabulary (preflight), and the values the fault injection found accepted."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.cli.args import ArgError, build_parser, parse_args
from slime.cli.command import run_cli
from slime.cli.flag_ranges import RANGES, Range, flag_name, float_dests
from slime.cli.preflight import PreflightError, check_token_ids
from slime.cli.train import parse_train_args

INT_DESTS = {a.dest for a in build_parser()._actions if a.type is int}  # noqa: SLF001


def outside(rng: Range, integer: bool) -> st.SearchStrategy:
    """Values the range refuses (integers for an int flag)."""
    parts = []
    if rng.low is not None:
        top = rng.low if rng.open_low else (math.ceil(rng.low) - 1 if integer else math.nextafter(rng.low, -math.inf))
        parts.append(st.integers(-(10**9), int(math.floor(top))) if integer else st.floats(-1e12, top, allow_nan=False))
    if rng.high is not None:
        parts.append(
            st.integers(int(math.floor(rng.high)) + 1, 10**9)
            if integer
            else st.floats(math.nextafter(rng.high, math.inf), 1e12, allow_nan=False)
        )
    return st.one_of(parts).filter(lambda v: v not in rng.also)


@st.composite
def out_of_range(draw):
    dest = draw(st.sampled_from(sorted(RANGES)))
    return dest, draw(outside(RANGES[dest], dest in INT_DESTS))


def parse_for(dest: str, argv: list[str]):
    """slime-train's parser for the trainer's own flags, slime-rollout's otherwise."""
    from slime.train.flags import TrainConfig

    trainer = dest in TrainConfig.defaults()
    return parse_train_args(argv) if trainer else parse_args(argv)


@settings(max_examples=60, deadline=None)
@given(case=out_of_range())
def test_a_value_outside_its_range_is_refused_naming_the_flag(case):
    dest, value = case
    with pytest.raises(ArgError) as e:
        parse_for(dest, [f"{flag_name(dest)}={value!r}"])
    assert str(e.value).startswith(f"{flag_name(dest)}: must be {RANGES[dest].describe()}, got "), str(e.value)


FLOATS = sorted(set(float_dests(build_parser())))


@settings(max_examples=40, deadline=None)
@given(dest=st.sampled_from(FLOATS), value=st.sampled_from(["nan", "inf", "-inf", "NaN"]))
def test_every_float_flag_refuses_nan_and_inf(dest, value):
    with pytest.raises(ArgError) as e:
        parse_args([f"{flag_name(dest)}={value}"])
    assert str(e.value).startswith(f"{flag_name(dest)}: must be "), str(e.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["--engine-max-batch-size", "0"],
        ["--request-max-retries", "-1"],
        ["--request-retry-window", "-1"],
        ["--engine-threads", "0"],
        ["--router-health-check-interval", "0"],
        ["--max-turns", "0"],
        ["--save-interval", "0"],
        ["--save-interval", "-1"],
        ["--micro-batch-size", "0"],
        ["--eps-clip", "-0.2"],
        ["--rollout-top-k", "-5"],
        ["--rollout-top-k", "0"],
        ["--rollout-num-cpus-per-engine", "0"],
        ["--kl-loss-coef", "nan"],
        ["--opd-kl-coef", "nan"],
        ["--actor-num-cpus-per-worker", "0"],
    ],
)
def test_the_values_the_fault_injection_found_are_refused_before_anything_starts(argv, capsys):
    ran = []
    assert run_cli("slime-train", argv, parse_train_args, ran.append) == 2
    assert ran == []
    assert capsys.readouterr().err.startswith(f"slime-train: error: {argv[0]}: must be ")


@pytest.mark.parametrize(
    "argv",
    [
        ["--rollout-top-k", "-1"],
        ["--rollout-top-k", "20"],
        ["--eps-clip", "0.2"],
        ["--request-max-retries", "0"],
        ["--rollout-num-cpus-per-engine", "0.5"],
    ],
)
def test_values_inside_their_range_parse(argv):
    parse_args(argv)


def test_a_stop_token_id_outside_the_vocabulary_is_refused_by_preflight(tiny_model_dir):
    vocab = json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"]
    args = parse_args(["--hf-checkpoint", str(tiny_model_dir), "--rollout-stop-token-ids", "2", "999999999"])
    with pytest.raises(PreflightError) as e:
        check_token_ids(args)
    assert str(e.value) == (
        f"--rollout-stop-token-ids: token id 999999999 is outside the model's vocabulary "
        f"(0..{vocab - 1}) of {tiny_model_dir / 'config.json'}"
    )
    check_token_ids(parse_args(["--hf-checkpoint", str(tiny_model_dir), "--rollout-stop-token-ids", str(vocab - 1)]))
