"""`slime.ray` reads the namespace once into frozen configs (issue #33): the rollout manager into `ManagerConfig`
(the fleet's `FleetConfig`, the metric log's `ReportConfig`, its own few flags), the Ray session into
`SessionConfig`. The namespace goes on only to slime's plugins (the controller) and wandb; the manager writes
where the router serves back onto it (`args.sglang_router_ip/port`, slime's contract for plugins)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from slime.cli.args import parse_args
from slime.cli.parser import build_parser
from slime.fleet.flags import FleetConfig
from slime.observability.flags import ReportConfig
from slime.ray.flags import ManagerConfig, SessionConfig
from slime.ray.rollout_manager import RolloutManager
from tests.args_reads import flag_reads

DESTS = {a.dest for a in build_parser()._actions if a.option_strings} | {"sglang_extra_args"}  # noqa: SLF001

# the one write: where the fleet's router serves, for slime's plugins that build URLs from args
STILL_ON_ARGS = {"slime/ray/rollout_manager.py": {"sglang_router_ip", "sglang_router_port"}}


def test_the_configs_of_a_minimal_command_line_are_the_parsers_defaults():
    args = parse_args(["--rollout-backend", "hf"])
    assert ManagerConfig.from_args(args) == ManagerConfig(
        fleet=FleetConfig.from_args(args),
        report=ReportConfig.from_args(args),
        load_debug_rollout_data=None,
        tool_config_path=None,
        rollout_batch_size=4,
        load=None,
    )
    assert SessionConfig.from_args(args) == SessionConfig(
        ray_address=None,
        rollout_backend="hf",
        hf_checkpoint=None,
        load_debug_rollout_data=None,
        rollout_num_engines=1,  # derived by finalize_args for the embedded backend
        log_dir=None,
    )


def test_the_manager_acts_on_its_config_and_writes_the_routers_address_onto_args(tmp_path):
    argv = ["--rollout-backend", "hf", "--hf-checkpoint", str(tmp_path), "--engine-startup-timeout", "0.01"]
    args = parse_args([*argv, "--load-debug-rollout-data", "x_{rollout_id}.pt", "--rollout-batch-size", "3"])
    manager = RolloutManager(args)
    config = manager.config
    assert (config.load_debug_rollout_data, config.rollout_batch_size) == ("x_{rollout_id}.pt", 3)
    assert config.fleet.engine.hf_checkpoint == str(tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.load = "x"  # type: ignore[misc]
    # --engine-startup-timeout bounds the wait for engines that do not come back
    manager.fleet = SimpleNamespace(engine_status=lambda: [{"state": "dead"}])
    with pytest.raises(TimeoutError, match=r"not back after 0s \(--engine-startup-timeout\)"):
        manager.recover_updatable_engines()
    manager.fleet = None
    manager._router_url("http://10.0.0.7:31000")  # noqa: SLF001 - what the fleet calls at start and after a move
    assert (args.sglang_router_ip, args.sglang_router_port) == ("10.0.0.7", 31000)


def test_slime_ray_reads_no_flag_from_args_but_writes_the_routers_address():
    """rollout_manager.py reads ManagerConfig, session.py SessionConfig (before: 11 flags read in the two, and the
    fleet's ~25 through `Fleet(args)`)."""
    assert flag_reads("slime/ray", DESTS) == STILL_ON_ARGS
