"""Weight updates from tensors on the embedded engine (inline and through shared memory), what the engine
refuses, its weight checker, and when the actor counts an update as a push."""

from __future__ import annotations

import pytest
import requests
import torch

from slime.weights.push import model_checksums, push_tensors
from slime.weights.transfer import serialize_named_tensors
from tests.weight_sync.helpers import hf_model, assert_serves


@pytest.mark.parametrize("transport", ["shm", "inline"])
def test_update_weights_from_tensor_serves_the_pushed_model(engines, refs, tensors_a, tensors_b, transport):
    e = engines[0]
    assert_serves(e.url(), refs["A"], "base")
    with serialize_named_tensors(tensors_b, transport=transport) as payload:
        answer = e.update_weights_from_tensor([payload.serialized], weight_version="v1")
    assert answer["success"] and answer["weight_version"] == "v1"
    assert e.get_weight_version() == "v1"
    assert_serves(e.url(), refs["B"], "v1")
    assert_serves(engines[1].url(), refs["A"], "base")  # the other engine was not touched
    # several buckets, both engines at once, through the trainer helper (each bucket serialised once)
    answers = push_tensors(engines, tensors_a, weight_version="v2", bucket_bytes=1 << 20, transport=transport)
    assert [a["weight_version"] for a in answers] == ["v2", "v2"]
    for x in engines:
        assert_serves(x.url(), refs["A"], "v2")
    # the version is SGLang's: unchanged when a push does not give one
    push_tensors(engines[:1], tensors_b, weight_version=None)
    assert e.get_weight_version() == "v2"
    assert_serves(e.url(), refs["B"], "v2", prompts=(0,))


def test_shared_memory_payload_is_removed_and_confined():
    t = [("w", torch.arange(6, dtype=torch.float32).view(2, 3))]
    with serialize_named_tensors(t) as payload:
        path = payload.path
        assert path.exists()
    assert not path.exists()
    from slime.weights.transfer import WeightFormatError, deserialize_named_tensors

    forged = payload.serialized.replace(str(path), "/etc/passwd")
    with pytest.raises(WeightFormatError, match="must be a slime-weights-"):
        deserialize_named_tensors(forged)


@pytest.mark.parametrize(
    "name, tensor, message",
    [
        ("model.no_such_layer.weight", torch.zeros(3), "no such parameter"),
        ("model.norm.weight", torch.zeros(64, dtype=torch.float64), "dtype float64 does not match"),
        ("model.norm.weight", torch.zeros(65), "shape [65] does not match"),
    ],
)
def test_bad_tensor_is_refused_naming_it_and_nothing_changes(engines, refs, tensors_b, name, tensor, message):
    e = engines[0]
    before = e.check_weights("checksum")["checksums"]
    # a good tensor first, then the bad one: the push is all or nothing
    with serialize_named_tensors([tensors_b[0], (name, tensor)]) as payload:
        with pytest.raises(requests.HTTPError) as err:
            e.update_weights_from_tensor([payload.serialized], weight_version="bad")
    assert err.value.response.status_code == 400
    assert name in str(err.value) and message in str(err.value)
    assert e.get_weight_version() == "base"
    assert e.check_weights("checksum")["checksums"] == before
    assert_serves(e.url(), refs["A"], "base", prompts=(0,))


def test_malformed_tensor_requests_are_400(engines):
    url = engines[0].url()
    for body, field in [
        ({}, "serialized_named_tensors"),
        ({"serialized_named_tensors": ["{}", "{}"]}, "tp_size 1"),
        ({"serialized_named_tensors": ["not json"]}, "JSON payload"),
        ({"serialized_named_tensors": ["{}"], "load_format": "direct"}, "load_format"),
    ]:
        r = requests.post(f"{url}/update_weights_from_tensor", json=body, timeout=30)
        assert r.status_code == 400 and field in r.json()["message"], (body, r.text)
    assert engines[0].get_weight_version() == "base"


def test_check_weights_snapshot_compare_reset(engines, tiny_model_dir, tensors_b, ck_a, ck_b):
    e = engines[0]
    assert model_checksums(hf_model(tiny_model_dir)) == ck_a
    assert e.check_weights("compare", checksums=ck_a)["equal"]
    assert e.check_weights("snapshot")["success"]
    same = e.check_weights("compare")
    assert same["equal"] and same["success"] and set(same["tensors"]) >= set(ck_a)
    push_tensors([e], tensors_b, weight_version="v1")
    diff = e.check_weights("compare")  # against the engine's own snapshot: per tensor
    assert not diff["equal"] and not diff["success"]
    assert {n: diff["tensors"][n] for n in ck_a} == {n: ck_a[n] == ck_b[n] for n in ck_a}
    assert sum(not v for v in diff["tensors"].values()) > 5 and "differ" in diff["message"]
    assert e.check_weights("compare_checksum", checksums=ck_b)["equal"]
    tampered = {**ck_b, "model.norm.weight": "0" * 64, "model.extra.weight": "0" * 64}
    answer = e.check_weights("compare", checksums=tampered)
    assert answer["mismatched"] == ["model.norm.weight"] and answer["missing"] == ["model.extra.weight"]
    assert [n for n, ok in answer["tensors"].items() if not ok] == ["model.norm.weight", "model.extra.weight"]
    assert e.check_weights("reset_tensors")["success"]
    after_reset = e.check_weights("compare", checksums=ck_b)
    assert not any(after_reset["tensors"].values())
    assert e.get_weight_version() == "v1"  # reset keeps the version, like SGLang
    with pytest.raises(RuntimeError, match="action must be one of"):
        e.check_weights("explode")
    with pytest.raises(RuntimeError, match="compare_checksum needs checksums"):
        e.check_weights("compare_checksum")


def test_actor_counts_a_push_only_when_it_completes(engines, tensors_b):
    """What the fleet waits for before a restarted engine takes requests: a push counts at its
    continue_generation (slime's pause -> buckets -> continue), an update from disk at once, and a
    push with a refused bucket not at all."""
    e = engines[0]
    start = e.push_count()  # the fixture's update from disk counted already
    e.pause_generation()
    with serialize_named_tensors(tensors_b[:1]) as payload:
        e.update_weights_from_tensor([payload.serialized], weight_version="b1")
    assert e.push_count() == start  # half a push: not yet
    e.continue_generation()
    assert e.pushes_after(start, timeout=0) == (start + 1, "b1")
    e.pause_generation()
    with serialize_named_tensors(tensors_b[:1]) as payload:
        e.update_weights_from_tensor([payload.serialized], weight_version="b2")
    with serialize_named_tensors([("model.no_such_layer.weight", torch.zeros(3))]) as payload:
        with pytest.raises(requests.HTTPError):
            e.update_weights_from_tensor([payload.serialized], weight_version="bad")
    e.continue_generation()
    assert e.push_count() == start + 1  # the failed push completed nothing
    e.continue_generation()  # a continue without a push: nothing either
    assert e.pushes_after(start + 1, timeout=0) == (start + 1, "b2")


def test_actor_counts_an_update_from_disk_as_a_push(engines, tiny_model_dir):
    e = engines[1]
    start = e.push_count()
    e.update_weights_from_disk(str(tiny_model_dir), "disk")
    assert e.pushes_after(start, timeout=0) == (start + 1, "disk")
