"""sglang-router's own `--router-*` flags reach the router slime starts (its real command line), or are named."""

from __future__ import annotations

import pytest
import requests

from slime.cli.args import parse_args
from slime.cli.honest_flags import unused_flags_line
from slime.cli.parser import build_parser
from slime.fleet.flags import FleetConfig
from slime.fleet.fleet import Fleet
from slime.fleet.router_options import SLIME_SETS, router_passthrough

USER_FLAGS = [
    "--router-policy",
    "manual",
    "--router-cache-threshold",
    "0.5",
    "--router-log-level",
    "debug",
    "--router-request-id-headers",
    "x-a",
    "x-b",
    "--router-max-concurrent-requests",
    "64",
    "--router-health-check-interval-secs",
    "7",
]


def test_set_router_flags_become_launch_router_options_and_defaults_stay_off_its_command_line():
    extra = router_passthrough(parse_args(USER_FLAGS), taken=SLIME_SETS)
    assert extra == [
        "--cache-threshold",
        "0.5",
        "--balance-abs-threshold",
        "10",
        "--balance-rel-threshold",
        "1.2",
        "--log-level",
        "debug",
        "--request-id-headers",
        "x-a",
        "x-b",
        "--max-concurrent-requests",
        "64",
        "--health-check-interval-secs",
        "7",
    ]
    # slime's own overrides of the router's defaults (as slime passes them), nothing else
    assert router_passthrough(parse_args([]), taken=SLIME_SETS) == [
        "--balance-abs-threshold",
        "10",
        "--balance-rel-threshold",
        "1.2",
        "--log-level",
        "warn",
    ]


def test_the_routers_own_policies_are_accepted():
    assert "manual" in build_parser()._option_string_actions["--router-policy"].choices  # noqa: SLF001
    assert parse_args(["--router-policy", "manual"]).router_policy == "manual"


def test_options_slime_keeps_are_named_at_start_up():
    line = unused_flags_line(
        build_parser(), parse_args(["--router-retry-max-retries", "9", "--worker-urls", "http://127.0.0.1:1"])
    )
    assert "sglang-router options slime keeps for itself" in line
    assert "--router-retry-max-retries" in line and "--worker-urls" in line


def test_the_router_the_fleet_starts_runs_with_the_users_flags(tmp_path):
    args = parse_args([*USER_FLAGS, "--log-dir", str(tmp_path)])
    fleet = Fleet(FleetConfig.from_args(args))
    fleet._start_router()  # noqa: SLF001 - the fleet's own router start, without engines
    try:
        # it answers, so launch_router accepted every option (it renames its process: argv is the command run)
        assert requests.get(f"{fleet.router.url}/health", timeout=10).status_code == 200
        argv = fleet.router.command()
        for option in (
            "--policy manual",
            "--cache-threshold 0.5",
            "--log-level debug",
            "--request-id-headers x-a x-b",
            "--max-concurrent-requests 64",
        ):
            assert option in " ".join(argv), (option, argv)
        # the user's value comes after slime's own and wins
        assert argv.index("7") > argv.index("--health-check-interval-secs")
        assert argv[argv.index("--health-check-interval-secs", argv.index("--health-failure-threshold")) + 1] == "7"
    finally:
        fleet.router.stop()


@pytest.mark.parametrize("flag", ["--router-retry-max-retries", "--router-prometheus-host"])
def test_kept_options_are_not_passed(flag):
    value = "9" if "retries" in flag else "0.0.0.0"
    assert router_passthrough(parse_args([flag, value]), taken=SLIME_SETS) == router_passthrough(
        parse_args([]), taken=SLIME_SETS
    )
