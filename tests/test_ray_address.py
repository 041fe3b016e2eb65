"""`--ray-address` where no cluster answers: our error naming the flag, before `ray.init` (which
retried forever, printing only Ray's warnings, with SIGTERM held), within the probe's bound."""

from __future__ import annotations

import json
import socket

import pytest

from slime.ray.address import CLIENT_DEFAULT_PORT, GCS_DEFAULT_PORT, RayAddressError, probe_ray_address, split_address


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "address, expected",
    [
        ("10.0.0.5:6380", ("10.0.0.5", 6380)),
        ("head-node", ("head-node", GCS_DEFAULT_PORT)),
        ("ray://head:10002", ("head", 10002)),
        ("ray://head", ("head", CLIENT_DEFAULT_PORT)),
        ("[::1]:7000", ("::1", 7000)),
        ("[fe80::1]", ("fe80::1", GCS_DEFAULT_PORT)),
    ],
)
def test_addresses_split_as_ray_reads_them(address, expected):
    assert split_address(address) == expected


@pytest.mark.parametrize("address", [":6379", "head:0", "head:99999", "head:port"])
def test_an_address_that_is_not_host_and_port_is_refused(address):
    with pytest.raises(RayAddressError):
        split_address(address)


def test_a_port_nothing_listens_on_is_refused_at_once():
    port = closed_port()
    with pytest.raises(RayAddressError, match=rf"^cannot connect to 127.0.0.1:{port} \(Connection refused\)"):
        probe_ray_address(f"127.0.0.1:{port}")


def test_the_command_exits_with_our_error_before_starting_ray(tiny_model_dir, tmp_path, cli_runs):
    (tmp_path / "p.jsonl").write_text(json.dumps({"input": "hi"}) + "\n")
    proc = cli_runs.start(
        [
            "-m",
            "slime",
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(tmp_path / "p.jsonl"),
            "--ray-address",
            "127.0.0.1:1",
        ],
        deadline=120,
    )
    out = cli_runs.stop(proc, 0, 120)  # (signal 0: nothing sent) wait for the end, read the output
    assert proc.returncode == 1, out[-3000:]
    assert (
        "slime-rollout: error: --ray-address 127.0.0.1:1: cannot connect to 127.0.0.1:1 (Connection refused); "
        "start the cluster there with `ray start --head`, or drop --ray-address to start a private Ray" in out
    ), out
    assert "Connecting to existing Ray cluster" not in out


def test_a_port_that_accepts_but_is_not_ray_is_refused_within_the_bound():
    """A listener that never speaks (ray.init waited there forever with SIGTERM held)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        with pytest.raises(RayAddressError, match=r"no answer from 127.0.0.1:\d+ within 0.5 s"):
            probe_ray_address(f"127.0.0.1:{s.getsockname()[1]}", timeout=0.5)


def test_a_real_gcs_passes(ray_cluster):
    probe_ray_address(ray_cluster.get_runtime_context().gcs_address)
