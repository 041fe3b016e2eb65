"""`slime-sandbox`'s flags are one frozen, typed config (`SandboxFlags`, issue #33): its fields are the server's
parser, `main` reads the namespace once, and the server and its sessions receive the config, never `args`."""

from __future__ import annotations

import contextlib
import dataclasses
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.sandbox.config import SandboxConfig, SessionSettings
from slime.sandbox.flags import SandboxFlags
from slime.sandbox.server import _parser
from tests.args_reads import flag_reads
from tests.test_flag_ranges import outside

DESTS = {a.dest for a in _parser()._actions if a.option_strings}  # noqa: SLF001


def test_the_config_of_an_empty_command_line_is_the_configs_defaults():
    flags = SandboxFlags.from_args(_parser().parse_args([]))
    assert flags == SandboxFlags()
    assert flags.range_problem() is None  # the defaults hold their own ranges
    assert set(DESTS) - {"help"} == {f.name for f in dataclasses.fields(SandboxFlags)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        flags.port = 1  # type: ignore[misc]


def test_the_limits_defaults_are_the_run_and_session_configs_and_the_flags_reach_them():
    """The defaults are SandboxConfig's and SessionSettings' (written there once); a flag given reaches the
    runs' and the sessions' config, and the sessions' cap defaults to --max-concurrency."""
    defaults = SandboxFlags()
    run, session = defaults.run_config([]), defaults.session_settings()
    for name in ("default_memory_mb", "max_run_timeout", "disk_mb", "cpus_per_run", "max_body_mb", "uid_base"):
        assert getattr(run, name) == getattr(SandboxConfig(), name)
    assert dataclasses.replace(session, max_sessions=SessionSettings().max_sessions) == SessionSettings()
    assert session.max_sessions == defaults.max_concurrency

    argv = ["--disk-mb", "300", "--max-concurrency", "3", "--session-idle-timeout", "5", "--egress", "gw=h:1"]
    flags = SandboxFlags.from_args(_parser().parse_args(argv))
    run, session = flags.run_config([["/usr", "/opt/usr"]]), flags.session_settings(egress_budget=7)
    assert (run.disk_mb, run.max_concurrency, run.ro_binds) == (300, 3, [["/usr", "/opt/usr"]])
    assert (session.idle_timeout, session.max_sessions, session.egress_budget) == (5.0, 3, 7)
    assert session.egress_targets == {"gw": ("h", 1)}
    assert (flags.queue, flags.bodies) == (48, 4)


def test_the_sandbox_reads_no_flag_from_args():
    """server.py's `main` reads the namespace once (`SandboxFlags.from_args`); the server, its runs and its
    sessions get `SandboxFlags`/`SandboxConfig`/`SessionSettings`. (Before: 43 reads of 34 flags in server.py and sessions.py.)"""
    assert flag_reads("slime/sandbox", DESTS) == {}


def test_the_scan_finds_reads_by_attribute_and_by_getattr(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "x.py").write_text(
        "def f(args, self, config):\n"
        "    return args.a, self.args.b, config.c, args.not_a_flag, getattr(args, 'c', 1), getattr(config, 'a')\n"
    )
    assert flag_reads("pkg", {"a", "b", "c"}, tmp_path) == {"pkg/sub/x.py": {"a", "b", "c"}}


SANDBOX_RANGES = SandboxFlags.ranges()
SANDBOX_INTS = {a.dest for a in _parser()._actions if a.type is int}  # noqa: SLF001


@st.composite
def sandbox_out_of_range(draw):
    dest = draw(st.sampled_from(sorted(SANDBOX_RANGES)))
    return dest, draw(outside(SANDBOX_RANGES[dest], dest in SANDBOX_INTS))


@settings(max_examples=60, deadline=None)
@given(case=sandbox_out_of_range())
def test_a_sandbox_flag_outside_its_range_refuses_the_start_naming_it(case):
    """slime-sandbox has no preflight of its own: every numeric field's range is declared on SandboxFlags and
    `serve` refuses a value outside it (exit 2) before it binds or starts anything. (Before: only
    --egress-port and six session limits were checked, by hand; `--max-concurrency 0` or `--uid-base 0`,
    uid 0 being root, started.)"""
    from slime.sandbox.server import main

    dest, value = case
    option = "--" + dest.replace("_", "-")
    err = io.StringIO()
    with pytest.raises(SystemExit) as e, contextlib.redirect_stderr(err):
        main([f"{option}={value!r}"])
    assert e.value.code == 2
    err = err.getvalue()
    assert (
        err == f"slime-sandbox: refusing to start: {option}: must be {SANDBOX_RANGES[dest].describe()}, got {value!r}\n"
    )


@pytest.mark.parametrize("option", ["--max-run-timeout", "--cpus-per-run", "--session-idle-timeout", "--body-timeout"])
def test_a_sandbox_time_or_share_that_is_not_finite_refuses_the_start(option, capsys):
    from slime.sandbox.server import main

    with pytest.raises(SystemExit) as e:
        main([option, "nan"])
    assert e.value.code == 2
    assert capsys.readouterr().err == f"slime-sandbox: refusing to start: {option}: must be a finite number, got nan\n"


def test_every_numeric_sandbox_flag_has_a_range():
    """A numeric flag added without a range is not checked at start: name it here or give it one."""
    unchecked = {"fd", "lifeline_fd"}  # file descriptors handed over by the parent process, not typed by users
    numeric = {a.dest for a in _parser()._actions if a.type in (int, float)}  # noqa: SLF001
    assert numeric - unchecked == set(SANDBOX_RANGES)
