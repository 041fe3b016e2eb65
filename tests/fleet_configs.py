"""`fleet_config(*argv)`: the `FleetConfig` a slime command line gives (what the rollout manager hands the fleet),
for tests that build a `Fleet` by hand."""

from __future__ import annotations

from slime.cli.args import parse_args
from slime.fleet.flags import FleetConfig


def fleet_config(*argv: str) -> FleetConfig:
    return FleetConfig.from_args(parse_args(list(argv)))
