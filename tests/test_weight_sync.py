"""Weight sync on the embedded engine: slime's engine API (EngineActor methods, here as plain objects
around real engine processes) and the trainer-side helpers, on the tiny model.

Model A is what the engines load; model B is the same architecture with another seed. A push of B
must make an engine answer exactly what an engine serving B answers (greedy and seeded sampling),
and every request must come entirely from one weight version.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import os
import threading
import time
from types import SimpleNamespace

import pytest
import requests
import torch

from slime.engine.weight_sync import (
    HttpEngine, WeightSyncError, WeightUpdateGroup, model_checksums, paused, push_tensors, trainer_named_tensors,
)
from slime.engine.weight_transfer import SHM_PREFIX, named_checksums, serialize_named_tensors, shm_dir
from slime.fleet.engine_actor import EngineActor
from slime.utils.misc import find_free_port

PROMPTS = [[100 + 7 * i + j for j in range(n)] for i, n in enumerate((3, 11, 5, 17, 8, 2))]
LONG = 128  # tokens per request: long enough to still be running when an update arrives
SHORT = 24  # tokens when only the weights matter (a prefix of the LONG answer: same computation)


def _kind(i: int) -> dict:
    """Even prompts greedy, odd ones seeded sampling (the tiny model's greedy output repeats itself)."""
    return {} if i % 2 == 0 else {"temperature": 1.0, "sampling_seed": 1000 + i}


def gen(url: str, ids: list[int], max_new_tokens: int = LONG, **sp) -> dict:
    body = {"input_ids": ids, "return_logprob": True,
            "sampling_params": {"temperature": 0, "ignore_eos": True, "max_new_tokens": max_new_tokens, **sp}}
    r = requests.post(f"{url}/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def load(url: str) -> dict:
    return requests.get(f"{url}/get_load", timeout=30).json()


def wait_until(pred, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def actor(model_dir, tmp_path, rank: int = 0, fork_server: str | None = None) -> EngineActor:
    """An engine around a real server process; `fork_server`: started warm from it (as the fleet does)."""
    args = SimpleNamespace(engine_host="127.0.0.1", rollout_backend="hf", hf_checkpoint=str(model_dir),
                           engine_max_batch_size=16, engine_threads=1, engine_startup_timeout=120,
                           log_dir=str(tmp_path))
    return EngineActor(args, rank=rank, fork_server=fork_server)


@pytest.fixture(scope="module")
def fork_server(tiny_model_dir, tmp_path_factory):
    """The module's engine fork server (slime.engine.warm_start, model A preloaded): engines start warm,
    so a test that needs a fresh engine (one it kills) does not pay torch's import and the model load."""
    import sys
    import tempfile
    from pathlib import Path

    from slime.utils.child_process import ChildProcess

    where = Path(tempfile.mkdtemp(prefix="slime-ws-fork-"))  # short: a Unix socket path has ~107 bytes
    sock = where / "engines.sock"
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    server = ChildProcess([sys.executable, "-m", "slime.utils.fork_server", "--socket", str(sock), "--main",
                           "slime.engine.warm_start:serve", "--preload", "slime.engine.warm_start:preload",
                           "--preload-json", json.dumps([str(tiny_model_dir)])],
                          name="test engine fork server", log_path=tmp_path_factory.mktemp("fork") / "server.log",
                          env=env, ready=sock.exists, startup_timeout=120).start()
    yield str(sock)
    server.kill()


def hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def model_b_dir(tmp_path_factory):
    from slime.testing.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-b"), seed=1)


def _all(fn, items) -> list:
    with cf.ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(fn, items))


@pytest.fixture(scope="module")
def cluster(tiny_model_dir, model_b_dir, tmp_path_factory, fork_server):
    """Two engines serving A, plus what an engine serving B answers (then stopped)."""
    logs = tmp_path_factory.mktemp("engine-logs")
    a1, a2, b = actors = [actor(tiny_model_dir, logs, 0, fork_server), actor(tiny_model_dir, logs, 1, fork_server),
                          actor(model_b_dir, logs, 2, fork_server)]
    with contextlib.ExitStack() as stack:
        for x in actors:
            stack.callback(x.stop)
        for x in actors:  # from this thread: engines die with the thread that started them (PR_SET_PDEATHSIG)
            x.start()
        # concurrent requests are answered exactly as solo ones (tests/test_hf_engine.py)
        answers = _all(lambda job: gen(job[0].url(), PROMPTS[job[1]], **_kind(job[1])),
                       [(x, i) for x in (a1, b) for i in range(len(PROMPTS))])
        b.stop()
        yield [a1, a2], {"A": answers[:len(PROMPTS)], "B": answers[len(PROMPTS):]}


@pytest.fixture(scope="module")
def engines(cluster) -> list[EngineActor]:
    return cluster[0]


@pytest.fixture(scope="module")
def refs(cluster) -> dict[str, list[dict]]:
    return cluster[1]


@pytest.fixture(scope="module")
def tensors_b(model_b_dir):
    return trainer_named_tensors(hf_model(model_b_dir))


@pytest.fixture(scope="module")
def tensors_a(tiny_model_dir):
    return trainer_named_tensors(hf_model(tiny_model_dir))


@pytest.fixture(scope="module")
def ck_a(tensors_a):
    return named_checksums(tensors_a)


@pytest.fixture(scope="module")
def ck_b(tensors_b):
    return named_checksums(tensors_b)


@pytest.fixture(autouse=True)
def base_weights(engines, tiny_model_dir, refs):
    """Every test starts with both engines serving A as version "base", running, with no snapshot left over."""
    for e in engines:
        e.continue_generation()
        e.update_weights_from_disk(str(tiny_model_dir), "base")
        assert e.get_weight_version() == "base"
    yield


def outputs(r: dict) -> tuple[list[int], list[float]]:
    return r["output_ids"], [x[0] for x in r["meta_info"]["output_token_logprobs"]]


def assert_answer_of(r: dict, ref: dict) -> None:
    ids, lps = outputs(r)
    ref_ids, ref_lps = outputs(ref)
    assert ids == ref_ids[:len(ids)] and len(ids) in (SHORT, LONG)
    assert lps == pytest.approx(ref_lps[:len(ids)], abs=1e-4)


def assert_serves(url: str, refs_of_model: list[dict], version: str, prompts=(0, 1)) -> None:
    for i in prompts:
        r = gen(url, PROMPTS[i], SHORT, **_kind(i))
        assert_answer_of(r, refs_of_model[i])
        assert r["meta_info"]["weight_version"] == version
        assert r["meta_info"]["weight_versions"] == [{"version": version, "start": 0, "end": SHORT}]


# ---------------------------------------------------------------------------------------------- tensor path
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
    from slime.engine.weight_transfer import WeightFormatError, deserialize_named_tensors

    forged = payload.serialized.replace(str(path), "/etc/passwd")
    with pytest.raises(WeightFormatError, match="must be a slime-weights-"):
        deserialize_named_tensors(forged)


@pytest.mark.parametrize("name, tensor, message", [
    ("model.no_such_layer.weight", torch.zeros(3), "no such parameter"),
    ("model.norm.weight", torch.zeros(64, dtype=torch.float64), "dtype float64 does not match"),
    ("model.norm.weight", torch.zeros(65), "shape [65] does not match"),
])
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
    for body, field in [({}, "serialized_named_tensors"), ({"serialized_named_tensors": ["{}", "{}"]}, "tp_size 1"),
                        ({"serialized_named_tensors": ["not json"]}, "JSON payload"),
                        ({"serialized_named_tensors": ["{}"], "load_format": "direct"}, "load_format")]:
        r = requests.post(f"{url}/update_weights_from_tensor", json=body, timeout=30)
        assert r.status_code == 400 and field in r.json()["message"], (body, r.text)
    assert engines[0].get_weight_version() == "base"


# ----------------------------------------------------------------------------------------- distributed path
def ring_files(pid: int | None = None) -> list[str]:
    """This process's (or `pid`'s) shared-memory ring files that still have a name."""
    return sorted(p.name for p in shm_dir().glob(f"{SHM_PREFIX}{pid or os.getpid()}-ring-*"))


@pytest.mark.parametrize("transport, ring_slot_bytes", [("auto", 4096), ("auto", 1 << 20), ("broadcast", 4096)])
def test_distributed_push_in_buckets_to_two_engines(engines, refs, tensors_a, tensors_b, ck_b, transport,
                                                    ring_slot_bytes):
    """The shared-memory ring (chunks smaller and larger than the buckets) and the forced broadcast."""
    group = WeightUpdateGroup(engines, group_name="g-test", timeout=60, transport=transport,
                              ring_slot_bytes=ring_slot_bytes)
    group.connect()
    assert group.transport == ("shm_ring" if transport == "auto" else "broadcast"), group.transport_reason
    assert ring_files() == []  # unlinked as soon as every engine mapped them
    try:
        with paused(engines):
            answers = group.push(tensors_b, weight_version="v1", bucket_bytes=1 << 20,  # many flat buckets
                                 load_format="flattened_bucket")
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
    from slime.engine.weight_ring import RingReader, RingUnavailable, RingWriter, host_id

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
        for paths, message in [(["/etc/passwd", offer["paths"][1]], "must be a slime-weights-"),
                               ([str(secret), offer["paths"][1]], "must be a slime-weights-"),
                               ([offer["paths"][0], str(shm_dir() / "slime-weights-nobody")], "No such file"),
                               ([offer["paths"][0]], "needs >= 2 paths")]:
            with pytest.raises(RingUnavailable, match=message):
                RingReader.map(json.dumps({**offer, "paths": paths}))
        with pytest.raises(RingUnavailable, match="token differs"):
            RingReader.map(json.dumps({**offer, "token": "00" * 32}))
    finally:
        ring.close()
    assert ring_files() == []


TRAINER = """
import sys, torch
from slime.engine.weight_sync import HttpEngine, WeightUpdateGroup, paused
from transformers import AutoModelForCausalLM
from slime.engine.weight_sync import trainer_named_tensors
engines = [HttpEngine(u) for u in sys.argv[2:]]
named = trainer_named_tensors(AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32))
group = WeightUpdateGroup(engines, group_name="g-killed", timeout=60, ring_slot_bytes=8192)
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

    proc = subprocess.Popen([sys.executable, "-c", TRAINER, str(model_b_dir), *[e.url() for e in engines]],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "shm_ring"
        assert ring_files(proc.pid) == []
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
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


@pytest.mark.parametrize("body, message", [
    ({"backend": "nccl"}, "backend 'nccl' is not available"),
    ({"rank_offset": 0}, "rank_offset must be in 1..world_size-1"),
    ({"master_port": "x"}, "master_port must be an integer"),
    ({"weight_transport": "pigeon"}, "weight_transport must be one of auto, broadcast, got 'pigeon'"),
])
def test_bad_group_requests_are_400(engines, body, message):
    full = {"master_address": "127.0.0.1", "master_port": 1234, "rank_offset": 1, "world_size": 2,
            "group_name": "g-bad", "backend": "gloo", **body}
    r = requests.post(f"{engines[0].url()}/init_weights_update_group", json=full, timeout=30)
    assert r.status_code == 400 and message in r.json()["message"]


# ------------------------------------------------------------------------------------------- weight checker
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


# -------------------------------------------------------------------------- updates with requests in flight
def _start_requests(url: str, results: dict, indices) -> list[threading.Thread]:
    threads = []
    for i in indices:
        th = threading.Thread(target=lambda i=i: results.__setitem__(i, gen(url, PROMPTS[i], **_kind(i))))
        th.start()
        threads.append(th)
    return threads


def _assert_each_answer_is_one_version(results: dict, refs, versions: dict[str, str]) -> dict[int, str]:
    """Every answer equals, token for token, what the model of its reported version answers alone."""
    seen = {}
    for i, r in results.items():
        v = r["meta_info"]["weight_version"]
        assert r["meta_info"]["weight_versions"] == [{"version": v, "start": 0, "end": LONG}]
        assert r["meta_info"]["finish_reason"]["type"] == "length"
        assert_answer_of(r, refs[versions[v]][i])
        seen[i] = v
    return seen


def test_pause_update_continue_with_requests_in_flight(engines, refs, tensors_b):
    e = engines[0]
    url = e.url()
    results: dict = {}
    restarted0 = load(url)["requests_restarted"]
    threads = _start_requests(url, results, range(4))
    wait_until(lambda: load(url)["num_running_reqs"] == 4)
    steps = load(url)["decode_steps_total"]
    wait_until(lambda: load(url)["decode_steps_total"] >= steps + 3)  # every row has tokens from A
    e.pause_generation()
    running = load(url)["num_running_reqs"]
    assert running >= 1
    threads += _start_requests(url, results, (4, 5))  # arrive while paused: must run on the new weights
    wait_until(lambda: load(url)["num_waiting_reqs"] == 2)
    push_tensors([e], tensors_b, weight_version="v1")
    e.continue_generation()
    for th in threads:
        th.join(120)
    assert sorted(results) == list(range(6))  # nothing lost
    seen = _assert_each_answer_is_one_version(results, refs, {"base": "A", "v1": "B"})
    assert seen[4] == seen[5] == "v1"
    assert list(seen.values()).count("v1") >= running + 2
    assert load(url)["requests_restarted"] - restarted0 == running


@pytest.mark.parametrize("path", ["tensor", "distributed", "disk"])
def test_update_without_pause_never_mixes_versions(engines, refs, tensors_b, model_b_dir, path):
    e = engines[1]
    url = e.url()
    results: dict = {}
    with contextlib.ExitStack() as stack:
        if path == "distributed":
            group = stack.enter_context(WeightUpdateGroup([e], group_name="g-live", timeout=60))
        restarted0 = load(url)["requests_restarted"]
        threads = _start_requests(url, results, range(4))
        wait_until(lambda: load(url)["num_running_reqs"] == 4 and load(url)["decode_steps_total"] > 0)
        if path == "tensor":
            push_tensors([e], tensors_b, weight_version="v1")
        elif path == "disk":
            e.update_weights_from_disk(str(model_b_dir), "v1")
        else:
            group.push(tensors_b, weight_version="v1")  # one bucket: a single atomic update
        for th in threads:
            th.join(120)
    assert sorted(results) == list(range(4))
    seen = _assert_each_answer_is_one_version(results, refs, {"base": "A", "v1": "B"})
    assert list(seen.values()).count("v1") == load(url)["requests_restarted"] - restarted0  # restarted ones only
    assert_serves(url, refs["B"], "v1", prompts=(0,))


def test_streamed_request_in_flight_is_aborted_not_mixed(engines, tensors_b):
    url = engines[0].url()
    body = {"input_ids": PROMPTS[2], "stream": True,
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True, "temperature": 0}}
    with requests.post(f"{url}/generate", json=body, stream=True, timeout=120) as r:
        lines = (ln for ln in r.iter_lines(decode_unicode=True) if ln)
        assert next(lines).startswith("data: {")
        push_tensors([engines[0]], tensors_b, weight_version="v1")
        chunks = list(lines)
    last = json.loads(chunks[-2][len("data: "):])
    assert chunks[-1] == "data: [DONE]"
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert "weights were updated" in last["meta_info"]["finish_reason"]["message"]
    assert last["meta_info"]["weight_version"] == "base"


def test_pause_modes(engines):
    url = engines[0].url()
    r = requests.post(f"{url}/pause_generation", json={"mode": "sideways"}, timeout=30)
    assert r.status_code == 400 and "mode must be" in r.json()["message"]
    results: dict = {}
    threads = _start_requests(url, results, (0,))
    wait_until(lambda: load(url)["num_running_reqs"] == 1)
    engines[0].pause_generation("abort")
    threads[0].join(60)
    assert results[0]["meta_info"]["finish_reason"]["type"] == "abort"
    assert load(url)["paused"]
    engines[0].continue_generation()
    assert not load(url)["paused"]


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


# ---- issue 20 item 7: an engine dies during a distributed push ----
class Watched:
    """An engine with an exit notice (what RemoteEngine gets from the fleet's supervised actor) that
    can SIGKILL itself when the `die_at`-th bucket of a push is announced to it (0: when it is asked
    to join a group)."""

    def __init__(self, engine: EngineActor, die_at: int | None = None):
        self.engine, self.die_at = engine, die_at
        self.exited: cf.Future = cf.Future()
        process = engine.server.process
        threading.Thread(target=lambda: self.exited.set_result(process.wait()), daemon=True).start()

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def __repr__(self) -> str:
        return f"engine {self.engine.rank}"

    def init_weights_update_group(self, **kwargs) -> dict:
        if self.die_at == 0:  # dies as it is asked to join
            self.engine.kill()
        return self.engine.init_weights_update_group(**kwargs)

    def update_weights_from_distributed(self, **kwargs) -> dict:
        if self.die_at:
            self.die_at -= 1
            if self.die_at == 0:
                self.engine.kill()
        return self.engine.update_weights_from_distributed(**kwargs)


OLD_GROUP_DEADLINE_S = 600.0  # far beyond the test's own run: a push that waited for it could not pass


@pytest.mark.parametrize("transport", ["auto", "broadcast"])
@pytest.mark.parametrize("when", ["start", "middle", "end"])
def test_push_survives_an_engine_killed_during_it(engines, refs, tiny_model_dir, fork_server, tensors_b, ck_b,
                                                  tmp_path, caplog, transport, when):
    """SIGKILL at the first, a middle or the last bucket: the dead engine is dropped, the group formed
    again with the survivors, and they get the whole push (checksums) and serve it, all before the
    broken group's deadline (600 s here) could pass: nothing waits in the dead member's collective
    (neither rank 0 nor a survivor's decode thread frees the broken gloo group); the log names the
    engine and the push."""
    from slime.engine.weight_transfer import bucket_named_tensors

    bucket_bytes = 64 << 10
    n = len(list(bucket_named_tensors(tensors_b, bucket_bytes)))
    assert n >= 5
    victim = actor(tiny_model_dir, tmp_path, rank=7, fork_server=fork_server)
    try:
        victim.start()
        members = [Watched(engines[0]), Watched(victim, {"start": 1, "middle": n // 2, "end": n}[when]),
                   Watched(engines[1])]
        group = WeightUpdateGroup(members, group_name="g-death", timeout=OLD_GROUP_DEADLINE_S, transport=transport,
                                  ring_slot_bytes=1 << 20)
        group.connect()
        assert group.transport == ("shm_ring" if transport == "auto" else "broadcast")
        try:
            started = time.monotonic()  # the broken group's collectives start after this: their deadline is later
            with caplog.at_level("WARNING", logger="slime.engine"), paused(members):
                answers = group.push(tensors_b, weight_version="d1", bucket_bytes=bucket_bytes)
            assert [a["weight_version"] for a in answers] == ["d1", "d1"]
            assert group.died == [(members[1], "the push of weight version 'd1'")]
            assert "engine 7 died during the push of weight version 'd1'; going on with the 2 surviving engine(s)" \
                in caplog.messages
            assert group.engines == [members[0], members[2]] and group.group_name == "g-death-1"
            assert group.transport == ("shm_ring" if transport == "auto" else "broadcast")
            assert victim.server.process.wait() is not None
            for e in engines:
                assert e.check_weights("compare", checksums=ck_b)["equal"]
                assert_serves(e.url(), refs["B"], "d1", prompts=(0,))
            with paused(group.engines):  # the group of survivors goes on
                group.push(tensors_b, weight_version="d2", bucket_bytes=1 << 20)
            assert [e.get_weight_version() for e in engines] == ["d2", "d2"]
            assert time.monotonic() - started < OLD_GROUP_DEADLINE_S  # the broken group's deadline never ran out
        finally:
            group.close()
        assert ring_files() == []
    finally:
        victim.stop()


@pytest.mark.parametrize("transport", ["auto", "broadcast"])
def test_group_formation_survives_an_engine_killed_while_joining(engines, tiny_model_dir, fork_server, tensors_b,
                                                                 ck_b, tmp_path, caplog, transport):
    """SIGKILL as an engine is asked to join (issue 20): `connect` drops it, forms the group with the
    survivors (a new name: their join of the broken rendezvous may still be pending) before the broken
    rendezvous' deadline, and the survivors get a whole push."""
    victim = actor(tiny_model_dir, tmp_path, rank=9, fork_server=fork_server)
    try:
        victim.start()
        members = [Watched(engines[0]), Watched(victim, die_at=0), Watched(engines[1])]
        # a name per case: the survivors hold the broken rendezvous of their name until its deadline
        group = WeightUpdateGroup(members, group_name=f"g-join-{transport}", timeout=OLD_GROUP_DEADLINE_S,
                                  transport=transport)
        started = time.monotonic()
        try:
            with caplog.at_level("WARNING", logger="slime.engine"):
                group.connect()
            assert group.died == [(members[1], f"forming weight-update group 'g-join-{transport}'")]
            assert f"engine 9 died during forming weight-update group 'g-join-{transport}'; going on with the 2 " \
                   "surviving engine(s)" in caplog.messages
            assert group.engines == [members[0], members[2]] and group.group_name == f"g-join-{transport}-1"
            assert group.transport == ("shm_ring" if transport == "auto" else "broadcast")
            with paused(group.engines):
                answers = group.push(tensors_b, weight_version="j1", bucket_bytes=1 << 20)
            assert [a["weight_version"] for a in answers] == ["j1", "j1"]
            assert [e.check_weights("compare", checksums=ck_b)["equal"] for e in engines] == [True, True]
            assert time.monotonic() - started < OLD_GROUP_DEADLINE_S  # the broken rendezvous never ran out
        finally:
            group.close()
        assert ring_files() == []
    finally:
        victim.stop()


def test_pause_and_continue_skip_a_dead_engine(engines, tiny_model_dir, fork_server, tmp_path):
    victim = actor(tiny_model_dir, tmp_path, rank=8, fork_server=fork_server)
    try:
        victim.start()
        members = [Watched(engines[0]), Watched(victim)]
        with paused(members):
            victim.kill()
        assert members[1].exited.result(timeout=60) is not None
        assert load(engines[0].url())["paused"] is False  # the live engine was continued
    finally:
        victim.stop()
