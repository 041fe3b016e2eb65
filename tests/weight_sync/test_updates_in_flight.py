"""Weight updates while requests run: paused or not, every answer comes entirely from one weight version
(token for token what that model answers alone), a streamed one is aborted, never mixed."""

from __future__ import annotations

import contextlib
import json
import threading

import pytest
import requests

from slime.weights.push import WeightUpdateGroup, push_tensors
from slime.testing.until import until
from tests.weight_sync.helpers import LONG, PROMPTS, assert_answer_of, assert_serves, gen, kind, load


def _start_requests(url: str, results: dict, indices) -> list[threading.Thread]:
    threads = []
    for i in indices:
        th = threading.Thread(target=lambda i=i: results.__setitem__(i, gen(url, PROMPTS[i], **kind(i))))
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
    assert until(lambda: load(url)["num_running_reqs"] == 4, 60, interval=0.005)
    steps = load(url)["decode_steps_total"]
    assert until(
        lambda: load(url)["decode_steps_total"] >= steps + 3, 60, interval=0.005
    )  # every row has tokens from A
    e.pause_generation()
    running = load(url)["num_running_reqs"]
    assert running >= 1
    threads += _start_requests(url, results, (4, 5))  # arrive while paused: must run on the new weights
    assert until(lambda: load(url)["num_waiting_reqs"] == 2, 60, interval=0.005)
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
        assert until(
            lambda: load(url)["num_running_reqs"] == 4 and load(url)["decode_steps_total"] > 0, 60, interval=0.005
        )
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
    body = {
        "input_ids": PROMPTS[2],
        "stream": True,
        "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True, "temperature": 0},
    }
    with requests.post(f"{url}/generate", json=body, stream=True, timeout=120) as r:
        lines = (ln for ln in r.iter_lines(decode_unicode=True) if ln)
        assert next(lines).startswith("data: {")
        push_tensors([engines[0]], tensors_b, weight_version="v1")
        chunks = list(lines)
    last = json.loads(chunks[-2][len("data: ") :])
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
    assert until(lambda: load(url)["num_running_reqs"] == 1, 60, interval=0.005)
    engines[0].pause_generation("abort")
    threads[0].join(60)
    assert results[0]["meta_info"]["finish_reason"]["type"] == "abort"
    assert load(url)["paused"]
    engines[0].continue_generation()
    assert not load(url)["paused"]
