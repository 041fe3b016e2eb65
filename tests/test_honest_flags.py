"""The start-up notice names every upstream flag the user set that does not act here, whatever its type."""

from __future__ import annotations

import argparse

from hypothesis import given, settings
from hypothesis import strategies as st

from slime.cli.honest_flags import ACTED_ON, unused_flags, unused_flags_line
from slime.cli.parser import build_parser

PARSER = build_parser()


def named(argv: list[str]) -> set[str]:
    return {flag for flags in unused_flags(PARSER, PARSER.parse_args(argv)).values() for flag in flags}


def switches() -> list[str]:
    """Upstream on/off flags not acted on here whose dest no other flag shares (setting one changes the value)."""
    dests: dict[str, int] = {}
    for a in PARSER._actions:  # noqa: SLF001
        dests[a.dest] = dests.get(a.dest, 0) + 1
    out = []
    for group in PARSER._action_groups:  # noqa: SLF001
        if (group.title or "").startswith("upstream"):
            out += [
                a.option_strings[0]
                for a in group._group_actions  # noqa: SLF001
                if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction))  # noqa: SLF001
                and a.dest not in ACTED_ON
                and dests[a.dest] == 1
            ]
    return sorted(out)


def test_an_empty_command_line_names_nothing():
    assert unused_flags_line(PARSER, PARSER.parse_args([])) is None


def test_disable_flags_set_to_true_are_named():
    assert named(["--disable-compute-advantages-and-returns", "--disable-wandb-random-suffix"]) == {
        "--disable-compute-advantages-and-returns",
        "--disable-wandb-random-suffix",
    }


def test_both_kinds_of_switch_are_among_the_upstream_flags():
    kinds = {type(PARSER._option_string_actions[f]).__name__ for f in switches()}  # noqa: SLF001
    assert kinds == {"_StoreTrueAction", "_StoreFalseAction"}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(switches()), min_size=1, max_size=6, unique=True))
def test_every_switch_set_is_named(flags):
    assert named(flags) == set(flags)


def test_the_rollout_buffer_flags_say_a_plugin_reads_them():
    """slime's rollout-buffer example reads them (it runs here): the notice says so, not "not implemented"."""
    groups = unused_flags(
        PARSER, PARSER.parse_args(["--rollout-buffer-url", "http://127.0.0.1:1", "--data-pad-size-multiplier", "64"])
    )
    assert groups == {
        "read only by a rollout function that asks for it (slime's rollout-buffer example, which runs here)": [
            "--rollout-buffer-url"
        ],
        "not implemented here": ["--data-pad-size-multiplier"],
    }
