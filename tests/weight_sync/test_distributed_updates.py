"""Weight updates through a weight-update group (the shared-memory ring or the broadcast): buckets to two
engines, the fallback to the broadcast, the ring's confinement, a killed trainer, and refused groups."""

from __future__ import annotations

import json

import pytest
import requests
import torch

from slime.weights.push import HttpEngine, WeightSyncError, WeightUpdateGroup, paused
from slime.weights.transfer import shm_dir
from slime.utils.misc import find_free_port
from tests.weight_sync.helpers import assert_serves, ring_files


# The tiny model is ~39 MB (its embedding nearly all of it). 64 KiB slots: each 1 MiB bucket travels in 16
# chunks, chunk boundaries cut through tensors, the embedding spans ~600 chunks and the 4-slot ring wraps
# ~150 times per push. (4 KiB slots proved nothing more at 9,500 chunks a push: 158 s of a 48-min suite.)
@pytest.mark.parametrize("transport, ring_slot_bytes", [("auto", 64 << 10), ("auto", 1 << 20), ("broadcast", 4096)])
def test_distributed_push_in_buckets_to_two_engines(
    engines, refs, tensors_a, tensors_b, ck_b, transport, ring_slot_bytes
):
    """The shared-memory ring (chunks smaller and larger than the buckets) and the forced broadcast."""
    group = WeightUpdateGroup(
        engines, group_name="g-test", timeout=60, transport=transport, ring_slot_bytes=ring_slot_bytes
    )
    group.connect()
    assert group.transport == ("shm_ring" if transport == "auto" else "broadcast"), group.transport_reason
    assert ring_files() == []  # unlinked as soon as every engine mapped them
    try:
        with paused(engines):
            answers = group.push(
                tensors_b,
                weight_version="v1",
                bucket_bytes=1 << 20,  # many flat buckets
                load_format="flattened_bucket",
            )
        assert [a["weight_version"] for a in answers] == ["v1", "v1"]
        for e in engines:
            assert_serves(e.url(), refs["B"], "v1")
            check = e.check_weights("compare", checksums=ck_b)
            assert check["equal"] and check["success"] and all(check["tensors"].values())
        # SGLang's default layout: one broadcast per tensor, received straight into the parameters
        group.push(tensors_a, weight_version="v2", load_format=None)
        for e in engines:
            assert_serves(e.url(), refs["A"], "v2", prompts=(0,))
        # a tensor the model does not have: refused by name, the broadcast still completes, nothing changes
        bad = [tensors_b[0], ("model.norm.weight", torch.zeros(65))]
        for load_format in (None, "flattened_bucket"):
            with pytest.raises(WeightSyncError, match=r"'model.norm.weight': shape \[65\] does not match"):
                group.push(bad, weight_version="bad", load_format=load_format)
            for e in engines:
                assert e.get_weight_version() == "v2"
                assert_serves(e.url(), refs["A"], "v2", prompts=(0,))
        group.push(tensors_b, weight_version="v3")  # the group is still usable
        assert [e.get_weight_version() for e in engines] == ["v3", "v3"]
        for e in engines:
            assert e.check_weights("compare", checksums=ck_b)["equal"]
    finally:
        group.close()
    assert ring_files() == []
    with pytest.raises(requests.HTTPError, match="'g-test' does not exist"):
        engines[0].update_weights_from_distributed(["model.norm.weight"], ["float32"], [[64]], "g-test")
    assert engines[0].destroy_weights_update_group("g-test")["success"] is False  # tolerated, like slime


class BroadcastOnlyEngine(HttpEngine):
    """An engine that does not know the ring field (as SGLang's init request has no such field)."""

    def init_weights_update_group(self, *args, weight_transport=None, **kwargs) -> dict:
        return super().init_weights_update_group(*args, **kwargs)


def test_ring_falls_back_to_broadcast_when_one_engine_cannot_map_it(engines, refs, tensors_b, ck_b):
    clients = [HttpEngine(engines[0].url()), BroadcastOnlyEngine(engines[1].url())]
    with WeightUpdateGroup(clients, group_name="g-mixed", timeout=60) as group:
        assert group.transport == "broadcast"
        assert f"{clients[1]!r}: engine does not offer the ring" in group.transport_reason
        assert ring_files() == []
        with paused(clients):  # engine 0 had mapped the ring: it reads the decision and takes the broadcast
            group.push(tensors_b, weight_version="m1", bucket_bytes=1 << 20)
    for e in engines:
        assert e.get_weight_version() == "m1"
        assert e.check_weights("compare", checksums=ck_b)["equal"]
    assert_serves(engines[0].url(), refs["B"], "m1", prompts=(0,))


def test_engine_maps_only_a_trainer_ring_on_its_own_host(tmp_path):
    from slime.weights.ring import RingReader, RingUnavailable, RingWriter, host_id

    ring = RingWriter.create(2, 4096)
    try:
        offer = json.loads(ring.offer())
        reader = RingReader.map(json.dumps(offer))  # the real offer maps
        assert len(reader.slots) == 2 and reader.slot_bytes == 4096
        reader.close()
        with pytest.raises(RingUnavailable, match="another host"):
            RingReader.map(json.dumps({**offer, "host": "not-" + host_id()}))
        secret = tmp_path / "slime-weights-secret"
        secret.write_bytes(bytes(4096))
        for paths, message in [
            (["/etc/passwd", offer["paths"][1]], "must be a slime-weights-"),
            ([str(secret), offer["paths"][1]], "must be a slime-weights-"),
            ([offer["paths"][0], str(shm_dir() / "slime-weights-nobody")], "No such file"),
            ([offer["paths"][0]], "needs >= 2 paths"),
        ]:
            with pytest.raises(RingUnavailable, match=message):
                RingReader.map(json.dumps({**offer, "paths": paths}))
        with pytest.raises(RingUnavailable, match="token differs"):
            RingReader.map(json.dumps({**offer, "token": "00" * 32}))
    finally:
        ring.close()
    assert ring_files() == []


TRAINER = """
import sys, torch
from slime.weights.push import HttpEngine, WeightUpdateGroup, paused
from transformers import AutoModelForCausalLM
from slime.weights.push import trainer_named_tensors
engines = [HttpEngine(u) for u in sys.argv[2:]]
named = trainer_named_tensors(AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32))
group = WeightUpdateGroup(engines, group_name="g-killed", timeout=60, ring_slot_bytes=64 << 10)
group.connect()
with paused(engines):
    group.push(named, weight_version="from-killed", bucket_bytes=1 << 20)
print(group.transport, flush=True)
sys.stdin.read()  # until killed
"""


def test_ring_files_are_gone_after_the_trainer_is_killed(engines, refs, model_b_dir, tensors_a, ck_b):
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(model_b_dir), *[e.url() for e in engines]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "shm_ring"
        assert ring_files(proc.pid) == []
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        proc.stdin.close()
        proc.stdout.close()
    assert ring_files(proc.pid) == []
    for e in engines:
        assert e.check_weights("compare", checksums=ck_b)["equal"]
        assert_serves(e.url(), refs["B"], "from-killed", prompts=(0, 1))
        assert e.destroy_weights_update_group("g-killed")["success"]  # the engine releases its mapping
    # a new trainer forms the same group again
    with WeightUpdateGroup(engines, group_name="g-killed", timeout=60) as group, paused(engines):
        group.push(tensors_a, weight_version="after")
    assert_serves(engines[0].url(), refs["A"], "after", prompts=(0,))


def test_distributed_push_over_http_helper(engines, refs, tensors_b):
    clients = [HttpEngine(e.url()) for e in engines]
    with WeightUpdateGroup(clients, group_name="g-http", timeout=60) as group, paused(clients):
        group.push(tensors_b, weight_version="7")
    assert [c.get_weight_version() for c in clients] == ["7", "7"]
    assert_serves(engines[1].url(), refs["B"], "7", prompts=(1,))


def test_group_that_cannot_rendezvous_fails_within_its_deadline(engines, refs):
    e = engines[0]
    port = find_free_port()  # nobody listens there
    with pytest.raises(requests.HTTPError) as err:  # the actor call's own deadline is timeout + 30 s
        e.init_weights_update_group("127.0.0.1", port, 1, 2, "g-nobody", "gloo", timeout=2)
    assert err.value.response.status_code == 400
    assert f"could not rendezvous with the trainer at 127.0.0.1:{port}" in str(err.value)
    assert "deadline 2 s" in str(err.value)
    # the engine keeps serving, and the name is free again
    assert_serves(e.url(), refs["A"], "base", prompts=(0,))
    with WeightUpdateGroup([e], group_name="g-nobody", timeout=30):
        pass
    # trainer side: an engine that cannot join makes connect() fail at once, naming it
    dead = HttpEngine(f"http://127.0.0.1:{find_free_port()}", timeout=5)
    group = WeightUpdateGroup([engines[1], dead], group_name="g-dead", timeout=3)
    with pytest.raises(WeightSyncError, match=r"init_weights_update_group 'g-dead' failed: HttpEngine\(http://"):
        group.connect()
    assert not group.connected


@pytest.mark.parametrize(
    "body, message",
    [
        ({"backend": "nccl"}, "backend 'nccl' is not available"),
        ({"rank_offset": 0}, "rank_offset must be in 1..world_size-1"),
        ({"master_port": "x"}, "master_port must be an integer"),
        ({"weight_transport": "pigeon"}, "weight_transport must be one of auto, broadcast, got 'pigeon'"),
    ],
)
def test_bad_group_requests_are_400(engines, body, message):
    full = {
        "master_address": "127.0.0.1",
        "master_port": 1234,
        "rank_offset": 1,
        "world_size": 2,
        "group_name": "g-bad",
        "backend": "gloo",
        **body,
    }
    r = requests.post(f"{engines[0].url()}/init_weights_update_group", json=full, timeout=30)
    assert r.status_code == 400 and message in r.json()["message"]
