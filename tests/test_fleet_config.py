"""The fleet receives its flags as one frozen `FleetConfig` (issue #33), read once from the namespace by the rollout
manager and handed down in parts: each engine actor gets an `EngineConfig`, the router a `RouterConfig`'s options.
Nothing in `slime.fleet` reads a flag off `args`; where the router serves goes back to the manager, which writes it
onto `args.sglang_router_ip/port` (slime's contract for plugins)."""

from __future__ import annotations

import dataclasses
import pickle
from types import SimpleNamespace

import pytest

from slime.cli.args import parse_args
from slime.cli.parser import build_parser
from slime.fleet.engine_server import hf_server, sglang_server
from slime.fleet.flags import EngineConfig, FleetConfig, FleetFlags, RouterConfig
from slime.fleet.fleet import Fleet
from slime.fleet.placement import engine_bundles
from slime.fleet.router import Router
from slime.ray.rollout_manager import RolloutManager
from tests.args_reads import flag_reads

# every flag of the parser, and the `--sglang-*` passthrough parse_args stores beside them
DESTS = {a.dest for a in build_parser()._actions if a.option_strings} | {"sglang_extra_args"}  # noqa: SLF001


def config_of(*argv: str) -> FleetConfig:
    return FleetConfig.from_args(parse_args(["--rollout-backend", "hf", *argv]))


def test_the_config_of_a_minimal_command_line_is_the_parsers_defaults():
    config = config_of()
    assert config == FleetConfig(
        flags=FleetFlags(),
        engine=EngineConfig(
            rollout_backend="hf",
            hf_checkpoint=None,
            engine_host="127.0.0.1",
            log_dir=None,
            engine_startup_timeout=300.0,
            engine_max_batch_size=32,
            engine_threads=None,
            rollout_num_gpus_per_engine=1,
            num_gpus_per_node=8,
            offload=False,
            rollout_seed=42,
            sglang_mem_fraction_static=None,
            sglang_pp_size=1,
            sglang_extra_args={},
        ),
        router=RouterConfig(
            sglang_router_ip=None,
            sglang_router_port=None,
            router_policy="round_robin",
            router_prometheus_port=None,
            router_health_check_interval=30,
            log_dir=None,
            # slime's own overrides of sglang-router's defaults, as slime passes them
            extra_args=("--balance-abs-threshold", "10", "--balance-rel-threshold", "1.2", "--log-level", "warn"),
        ),
        rollout_num_engines=1,  # derived by finalize_args for the embedded backend
        rollout_num_gpus=1,
        rollout_num_cpus_per_engine=1.0,
        rollout_external_engine_addrs=None,
    )
    # the defaults are the parser's, written there once (the parsed fields have none of their own)
    parser = build_parser()
    for part in (config.engine, config.router):
        for f in dataclasses.fields(part):
            if f.name not in ("rollout_backend", "sglang_extra_args", "extra_args"):
                assert getattr(part, f.name) == parser.get_default(f.name), f.name
    assert config.flags == FleetFlags.from_args(parser.parse_args([]))
    # frozen, and what Ray ships to each engine actor
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.engine.hf_checkpoint = "x"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(config)) == config


def test_the_flags_given_reach_the_engines_and_the_routers_command_lines(tmp_path):
    config = config_of(
        *("--engine-max-batch-size", "5", "--engine-threads", "2", "--engine-startup-timeout", "9"),
        *("--hf-checkpoint", str(tmp_path), "--log-dir", str(tmp_path), "--engine-max-restarts", "1"),
        *("--router-policy", "cache_aware", "--router-cache-threshold", "0.5", "--router-health-check-interval", "4"),
        *("--rollout-num-engines", "3", "--rollout-num-cpus-per-engine", "0.5"),
    )
    hf = hf_server(config.engine, 0, "127.0.0.1")  # built, not started
    assert " --max-batch-size 5 --num-threads 2" in " ".join(hf.command)
    assert hf.command[hf.command.index("--model-path") + 1] == str(tmp_path)
    assert (hf.process.startup_timeout, hf.process.log_path.parent) == (9.0, tmp_path)
    assert config.flags.engine_max_restarts == 1 and Fleet(config).supervisor.max_restarts == 1
    assert engine_bundles(config) == [{"CPU": 0.5}] * 3

    router = " ".join(Router(host="127.0.0.1", **config.router.router_kw()).command())
    for option in ("--policy cache_aware", "--health-check-interval-secs 4", "--cache-threshold 0.5"):
        assert option in router, (option, router)

    sglang = config_of(
        *("--rollout-backend", "sglang", "--hf-checkpoint", str(tmp_path), "--rollout-num-gpus", "4"),
        *("--rollout-num-gpus-per-engine", "2"),
        *("--sglang-mem-fraction-static", "0.6", "--rollout-seed", "7", "--offload"),
        *("--sglang-attention-backend", "fa3", "--sglang-enable-metrics"),  # the passthrough
    )
    cmd = " ".join(sglang_server(sglang.engine, 1, "127.0.0.1").command)
    for option in ("--tp-size 2 --base-gpu-id 2", "--mem-fraction-static 0.6", "--enable-memory-saver"):
        assert option in cmd, (option, cmd)
    assert "--random-seed 7" in cmd and cmd.endswith("--attention-backend fa3 --enable-metrics")
    assert engine_bundles(sglang) == [{"GPU": 1, "CPU": 1}] * 4
    assert Fleet(sglang)._engine_layout() == (2, 1, 2)  # noqa: SLF001


def test_the_router_address_goes_back_to_the_manager_which_writes_it_onto_args():
    """The fleet starts no router when given one (--sglang-router-ip/port), and hands where its router serves to
    its owner: the manager keeps slime's `args.sglang_router_ip/port` (the fleet's config stays as read)."""
    given = Fleet(config_of("--sglang-router-ip", "10.0.0.5", "--sglang-router-port", "30000"))
    given._start_router()  # noqa: SLF001
    assert (given.router, given.endpoints.router_url) == (None, "http://10.0.0.5:30000")

    args = SimpleNamespace(sglang_router_ip=None, sglang_router_port=None)
    manager = SimpleNamespace(args=args)
    fleet = Fleet(config_of(), on_router_url=lambda url: RolloutManager._router_url(manager, url))  # noqa: SLF001
    fleet._publish_router("http://127.0.0.1:4321")  # noqa: SLF001 - what start and a router move call
    assert (args.sglang_router_ip, args.sglang_router_port) == ("127.0.0.1", 4321)
    assert fleet.endpoints.router_url == "http://127.0.0.1:4321"
    assert fleet.config.router.sglang_router_ip is None  # a restarted fleet would start its own router again


def test_the_fleet_reads_no_flag_from_args():
    """The manager reads the namespace once (`FleetConfig.from_args`); the fleet, its engine actors, servers,
    placement and supervision get `FleetConfig`/`EngineConfig`/`RouterConfig`. (Before: 25 flags read
    in engine_actor.py, engine_server.py, external_engines.py, fleet.py, placement.py and supervision.py.)"""
    assert flag_reads("slime/fleet", DESTS) == {}
