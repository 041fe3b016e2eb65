"""The embedded CPU engine, tested through its real HTTP server (a subprocess) on the tiny model."""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
import time

import httpx
import pytest
import torch

from slime.testing.until import until
from tests.hf_engine_fixtures import run_engine

PROMPTS = [[100 + 7 * i + j for j in range(n)] for i, n in enumerate((3, 11, 5, 17, 8, 2))]


@pytest.fixture(scope="module")
def engine(tiny_model_dir, engine_fork_server):
    """Forked warm from the session's fork server, as slime-train starts its engines (the cold start is
    tests/test_cold_start.py's)."""
    with run_engine(tiny_model_dir, "--max-batch-size", "16", fork_server=engine_fork_server) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            yield client


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(tiny_model_dir))


def gen(client: httpx.Client, ids, **sp) -> dict:
    body = {"input_ids": ids, "sampling_params": {"temperature": 0, "ignore_eos": True, **sp}, "return_logprob": True}
    r = client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def load(client: httpx.Client) -> dict:
    return client.get("/get_load").json()


def teacher_forced_logprobs(model, prompt, output, temperature):
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(1, torch.tensor(output)[:, None])[:, 0].tolist()


def test_greedy_is_deterministic_and_logprobs_match_teacher_forcing(engine, hf):
    model, _ = hf
    a, b = gen(engine, PROMPTS[1], max_new_tokens=12), gen(engine, PROMPTS[1], max_new_tokens=12)
    assert a["output_ids"] == b["output_ids"] and len(a["output_ids"]) == 12
    meta = a["meta_info"]
    assert meta["finish_reason"]["type"] == "length"
    assert meta["prompt_tokens"] == len(PROMPTS[1]) and meta["completion_tokens"] == 12 and meta["cached_tokens"] == 0
    assert meta["weight_versions"] == [{"version": meta["weight_version"], "start": 0, "end": 12}]
    assert [t for _, t, _ in meta["output_token_logprobs"]] == a["output_ids"]
    ref = teacher_forced_logprobs(model, PROMPTS[1], a["output_ids"], 1.0)
    assert [lp for lp, _, _ in meta["output_token_logprobs"]] == pytest.approx(ref, abs=1e-4)
    # the greedy token is the argmax of the teacher-forced logits
    with torch.no_grad():
        logits = model(torch.tensor([PROMPTS[1] + a["output_ids"]])).logits[0, len(PROMPTS[1]) - 1 : -1]
    assert logits.argmax(-1).tolist() == a["output_ids"]


def test_sampling_seed_reproducible_and_logprobs_use_temperature(engine, hf):
    model, _ = hf
    sp = dict(temperature=0.8, top_p=0.95, top_k=50, max_new_tokens=10)
    a, b = gen(engine, PROMPTS[0], sampling_seed=1234, **sp), gen(engine, PROMPTS[0], sampling_seed=1234, **sp)
    c = gen(engine, PROMPTS[0], sampling_seed=99, **sp)
    assert a["output_ids"] == b["output_ids"]
    assert a["output_ids"] != c["output_ids"]
    got = [lp for lp, _, _ in a["meta_info"]["output_token_logprobs"]]
    # log-probs are log_softmax(logits / T) before top-k/top-p truncation
    assert got == pytest.approx(teacher_forced_logprobs(model, PROMPTS[0], a["output_ids"], 0.8), abs=1e-4)


def test_concurrent_requests_share_decode_steps_and_match_solo_results(engine):
    n = 24
    # half greedy, half seeded sampling (the random tiny model's greedy output tends to repeat one token)
    sps = [
        dict(max_new_tokens=n) if i % 2 else dict(max_new_tokens=n, temperature=1.0, sampling_seed=i)
        for i in range(len(PROMPTS))
    ]
    solo = [gen(engine, p, **sp) for p, sp in zip(PROMPTS, sps)]
    steps0 = load(engine)["decode_steps_total"]
    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        batched = list(pool.map(lambda a: gen(engine, a[0], **a[1]), zip(PROMPTS, sps)))
    after = load(engine)
    steps = after["decode_steps_total"] - steps0
    assert after["max_batch_size_seen"] > 1
    assert steps < len(PROMPTS) * (n - 1) * 0.75, steps  # one-at-a-time would need 6 * 23 steps
    for s, b in zip(solo, batched):
        assert b["output_ids"] == s["output_ids"]
        lp_s = [x[0] for x in s["meta_info"]["output_token_logprobs"]]
        assert [x[0] for x in b["meta_info"]["output_token_logprobs"]] == pytest.approx(lp_s, abs=1e-4)


def test_batch_input_and_text_input(engine, hf):
    _, tok = hf
    sp = {"max_new_tokens": 6, "temperature": 0}
    r = engine.post("/generate", json={"input_ids": PROMPTS[:3], "sampling_params": sp})
    assert r.status_code == 200
    assert [x["output_ids"] for x in r.json()] == [gen(engine, p, max_new_tokens=6)["output_ids"] for p in PROMPTS[:3]]
    text = "Hello, world! <|im_start|>"
    r = engine.post("/generate", json={"text": text, "sampling_params": {"max_new_tokens": 3, "temperature": 0}}).json()
    ids = tok.encode(text, add_special_tokens=False)
    assert r["meta_info"]["prompt_tokens"] == len(ids)
    assert r["output_ids"] == gen(engine, ids, max_new_tokens=3)["output_ids"]


def test_stop_strings_and_stop_token_ids(engine, hf):
    _, tok = hf
    sp = dict(max_new_tokens=12, temperature=1.0, sampling_seed=7)  # seeded: diverse yet reproducible tokens
    full = gen(engine, PROMPTS[2], **sp)["output_ids"]
    assert len(set(full)) > 3
    # stop token: output ends right after the first occurrence of the stop id
    stop_id = full[3]
    r = gen(engine, PROMPTS[2], **sp, stop_token_ids=[stop_id])
    k = full.index(stop_id) + 1
    assert r["output_ids"] == full[:k]
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    assert r["text"] == tok.decode(full[: k - 1])  # the stop token is trimmed from the text
    # stop string: the shortest prefix whose text contains it; text cut before the string
    stop = tok.decode(full[4:6]).strip() or tok.decode(full[4:6])
    k = next(i for i in range(1, 13) if stop in tok.decode(full[:i]))
    r = gen(engine, PROMPTS[2], **sp, stop=[stop, "never-seen-xyz"])
    assert r["output_ids"] == full[:k]
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    text = tok.decode(full[:k])
    assert r["text"] == text[: text.find(stop)]
    r = gen(engine, PROMPTS[2], **sp, stop=stop, no_stop_trim=True)
    assert r["output_ids"] == full[:k] and r["text"] == text
    # min_new_tokens masks the stop token until enough tokens exist
    r = gen(engine, PROMPTS[2], **sp, stop_token_ids=[full[0]], min_new_tokens=4)
    assert len(r["output_ids"]) >= 4 and full[0] not in r["output_ids"][:4]
    # the model's eos ends generation unless ignore_eos
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    r = gen(engine, PROMPTS[2], **sp, ignore_eos=False, stop_token_ids=[])
    assert eos not in r["output_ids"][:-1]


def test_max_new_tokens_zero_and_length(engine):
    r = gen(engine, PROMPTS[0], max_new_tokens=0)
    assert r["output_ids"] == [] and r["meta_info"]["finish_reason"]["type"] == "length"
    r = gen(engine, PROMPTS[0], max_new_tokens=5)
    assert len(r["output_ids"]) == 5 and r["meta_info"]["finish_reason"] == {"type": "length", "length": 5}


def prompt_logprobs(model, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1, at temperature 1, from one teacher-forced forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def score(client: httpx.Client, ids, **body) -> dict:
    body = {"input_ids": ids, "return_logprob": True, **body}
    r = client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def test_a_scoring_request_returns_sglangs_input_token_logprobs(engine, hf):
    """slime's OPD teacher call: max_new_tokens 0, logprob_start_len 0 -> one entry per input token,
    the first None, the rest log p(token | tokens before it) at T = 1 (SGLang does not scale them)."""
    model, _ = hf
    ids = PROMPTS[3]
    meta = score(engine, ids, logprob_start_len=0, sampling_params={"max_new_tokens": 0, "temperature": 0.6})
    entries = meta["input_token_logprobs"]
    assert [t for _, t, _ in entries] == ids and [x for _, _, x in entries] == [None] * len(ids)
    assert entries[0][0] is None
    assert [lp for lp, _, _ in entries[1:]] == pytest.approx(prompt_logprobs(model, ids), abs=1e-4)
    assert meta["output_token_logprobs"] == [] and meta["completion_tokens"] == 0
    assert meta["finish_reason"]["type"] == "length"


def test_input_token_logprobs_start_where_asked_and_default_to_the_last_token(engine, hf):
    model, _ = hf
    ids, k = PROMPTS[1], 4
    full = prompt_logprobs(model, ids)
    meta = score(engine, ids, logprob_start_len=k, sampling_params={"max_new_tokens": 0})
    assert [t for _, t, _ in meta["input_token_logprobs"]] == ids[k:]
    assert meta["input_token_logprobs"][0][0] is None  # SGLang pads the first reported entry, wherever it starts
    assert [lp for lp, _, _ in meta["input_token_logprobs"][1:]] == pytest.approx(full[k:], abs=1e-4)
    for start in ({}, {"logprob_start_len": -1}):
        meta = score(engine, ids, **start, sampling_params={"max_new_tokens": 0})
        assert meta["input_token_logprobs"] == [[None, ids[-1], None]]


def test_generation_with_prompt_logprobs_keeps_its_tokens_and_output_logprobs(engine, hf):
    model, _ = hf
    ids = PROMPTS[2]
    plain = gen(engine, ids, max_new_tokens=6)
    body = {
        "input_ids": ids,
        "return_logprob": True,
        "logprob_start_len": 0,
        "sampling_params": {"temperature": 0, "ignore_eos": True, "max_new_tokens": 6},
    }
    scored = engine.post("/generate", json=body).json()
    assert scored["output_ids"] == plain["output_ids"]
    out_lps = [lp for lp, _, _ in scored["meta_info"]["output_token_logprobs"]]
    assert out_lps == pytest.approx([lp for lp, _, _ in plain["meta_info"]["output_token_logprobs"]], abs=1e-5)
    assert [lp for lp, _, _ in scored["meta_info"]["input_token_logprobs"][1:]] == pytest.approx(
        prompt_logprobs(model, ids), abs=1e-4
    )
    # the whole sequence scored afterwards gives the sampled tokens their output log-probs (greedy: T = 1)
    seq = ids + scored["output_ids"]
    rescored = score(engine, seq, logprob_start_len=0, sampling_params={"max_new_tokens": 0})
    tail = [lp for lp, _, _ in rescored["input_token_logprobs"][-6:]]
    assert tail == pytest.approx(out_lps, abs=1e-4)


def test_top_logprobs_num_reports_the_k_most_likely_tokens_of_the_sampling_distribution(engine, hf):
    model, _ = hf
    ids = PROMPTS[3]
    for temperature in (0, 0.7):
        body = {
            "input_ids": ids,
            "return_logprob": True,
            "top_logprobs_num": 4,
            "sampling_params": {
                "temperature": temperature,
                "ignore_eos": True,
                "max_new_tokens": 5,
                "sampling_seed": 3,
            },
        }
        answer = engine.post("/generate", json=body).json()
        out, meta = answer["output_ids"], answer["meta_info"]
        rows = meta["output_top_logprobs"]
        with torch.no_grad():  # the whole distribution at each sampled position, as the engine scales it
            logits = model(torch.tensor([ids + out])).logits[0, len(ids) - 1 : -1].float()
        full = torch.log_softmax(logits / (temperature or 1.0), -1)
        for row, dist, (lp, token, _) in zip(rows, full, meta["output_token_logprobs"], strict=True):
            best = torch.topk(dist, 4)
            assert [i for _, i, _ in row] == best.indices.tolist()
            assert [v for v, _, _ in row] == pytest.approx(best.values.tolist(), abs=1e-4)
            assert lp <= row[0][0] + 1e-6 and (temperature or token == row[0][1])  # greedy samples the best
    assert "output_top_logprobs" not in gen(engine, ids, max_new_tokens=2)["meta_info"]  # not asked, not sent


def _background(client, ids, results, key, **sp):
    results[key] = gen(client, ids, **sp)


def test_abort_by_rid_and_abort_all(engine):
    results: dict = {}
    body = {
        "input_ids": PROMPTS[3],
        "rid": "abort-me",
        "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True, "temperature": 0},
        "return_logprob": True,
    }
    t = threading.Thread(target=lambda: results.update(a=engine.post("/generate", json=body).json()))
    t.start()
    assert until(lambda: load(engine)["num_tokens"] > len(PROMPTS[3]) + 3, 120)
    assert engine.post("/abort_request", json={"rid": "abort-me"}).status_code == 200
    t.join(30)
    r = results["a"]
    assert r["meta_info"]["finish_reason"]["type"] == "abort"
    assert r["meta_info"]["id"] == "abort-me"
    assert 3 <= len(r["output_ids"]) < 3000
    assert [x[1] for x in r["meta_info"]["output_token_logprobs"]] == r["output_ids"]

    threads = [
        threading.Thread(target=_background, args=(engine, p, results, i), kwargs=dict(max_new_tokens=3000))
        for i, p in enumerate(PROMPTS[:2])
    ]
    for th in threads:
        th.start()
    assert until(lambda: load(engine)["num_running_reqs"] == 2, 120)
    engine.post("/abort_request", json={"abort_all": True})
    for th in threads:
        th.join(300)
    assert [results[i]["meta_info"]["finish_reason"]["type"] for i in range(2)] == ["abort", "abort"]
    assert load(engine)["num_reqs"] == 0


def test_pause_and_continue(engine):
    results: dict = {}
    th = threading.Thread(target=_background, args=(engine, PROMPTS[4], results, "r"), kwargs=dict(max_new_tokens=60))
    th.start()
    assert until(lambda: load(engine)["num_tokens"] > len(PROMPTS[4]) + 2, 120)
    assert engine.post("/pause_generation", json={}).status_code == 200
    steps = load(engine)["decode_steps_total"]
    time.sleep(0.3)
    info = load(engine)
    assert info["paused"] and info["num_running_reqs"] == 1 and info["decode_steps_total"] == steps
    assert "r" not in results
    engine.post("/continue_generation", json={})
    th.join(300)
    assert len(results["r"]["output_ids"]) == 60
    assert results["r"]["output_ids"] == gen(engine, PROMPTS[4], max_new_tokens=60)["output_ids"]


def test_stream_is_cumulative_and_ends_with_done(engine):
    body = {"input_ids": PROMPTS[5], "stream": True, "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    with engine.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[len("data: ") :]) for ln in lines[:-1]]
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5, 6]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert chunks[-1]["output_ids"] == gen(engine, PROMPTS[5], max_new_tokens=6)["output_ids"]


def test_stream_client_disconnect_aborts_the_request(engine):
    body = {"input_ids": PROMPTS[5], "stream": True, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    with engine.stream("POST", "/generate", json=body) as r:
        lines = r.iter_lines()
        assert next(ln for ln in lines if ln).startswith("data: {")
    assert until(lambda: load(engine)["num_reqs"] == 0, 120)


def test_client_disconnect_aborts_a_non_streaming_request(engine):
    """As SGLang: a request whose client went away (our deadline, or the router closing its connection
    because ours closed) is aborted, not decoded to the end for nobody."""

    def aborted() -> float:
        text = engine.get("/metrics").text
        return float(
            next(ln.split()[-1] for ln in text.splitlines() if ln.startswith("sglang:num_aborted_requests_total"))
        )

    assert until(lambda: load(engine)["num_reqs"] == 0, 120)
    before = aborted()  # (another test's abort may still be counted after this: hence ">")
    body = {"input_ids": PROMPTS[2], "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    with httpx.Client(base_url=str(engine.base_url), timeout=1.0) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            impatient.post("/generate", json=body)
    assert until(lambda: load(engine)["num_reqs"] == 0 and aborted() > before, 120)


@pytest.mark.parametrize(
    "body, field",
    [
        ({"sampling_params": {}}, "input_ids or text"),
        ({"input_ids": []}, "input_ids"),
        ({"text": ""}, "text"),
        ({"input_ids": [1, 10**9]}, "input_ids"),
        ({"input_ids": [1, -1]}, "input_ids"),
        ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"input_ids": [1, 2], "sampling_params": {"temperature": -0.5}}, "temperature"),
        ({"input_ids": [1] * 5000}, "too long"),
        ({"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 2}, "logprob_start_len"),
        ({"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": -2}, "logprob_start_len"),
        ({"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": "0"}, "logprob_start_len"),
        ({"input_ids": [1, 2], "return_logprob": True, "top_logprobs_num": -1}, "top_logprobs_num"),
        ({"input_ids": [1, 2], "image_data": ["data:image/png;base64,AAAA"]}, "image_data: the served model"),
    ],
)
def test_bad_requests_are_400_naming_the_field(engine, body, field):
    r = engine.post("/generate", json=body)
    assert r.status_code == 400
    assert field in r.json()["error"]["message"]


def test_info_endpoints(engine, tiny_model_dir):
    assert engine.get("/health").status_code == 200
    assert engine.get("/health_generate").status_code == 200
    for path in ("/server_info", "/get_server_info"):
        info = engine.get(path).json()
        assert info["model_path"] == str(tiny_model_dir) and info["tokenizer_path"] == str(tiny_model_dir)
        assert info["backend"] == "slime-hf" and info["context_length"] == 4096 and info["max_total_num_tokens"] > 0
    for path in ("/model_info", "/get_model_info"):
        info = engine.get(path).json()
        assert info["is_generation"] is True and info["model_path"] == str(tiny_model_dir)
        assert "weight_version" in info
    assert engine.get("/get_weight_version").json() == {"weight_version": "default"}
    metrics = engine.get("/metrics").text
    for name in ("sglang:num_running_reqs", "sglang:generation_tokens_total", "sglang:num_requests_total"):
        assert f"\n{name}{{" in "\n" + metrics
    assert engine.get("/flush_cache").status_code == 200 and engine.post("/flush_cache").status_code == 200


def test_plain_data_is_json_and_routing_errors_have_fastapis_body(engine):
    """SGLang's server is FastAPI: a client (and the router) sees the same answers from ours, a Starlette app."""
    r = engine.get("/get_load")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert isinstance(r.json(), dict)
    missing = engine.get("/no_such_path")
    assert missing.status_code == 404 and missing.json() == {"detail": "Not Found"}
    wrong = engine.get("/generate")
    assert wrong.status_code == 405 and wrong.json() == {"detail": "Method Not Allowed"}
    assert "POST" in wrong.headers["allow"]


def test_the_engine_server_does_not_import_fastapi():
    """~0.5 CPU s of every engine start (the fork server's preload), for routing the handlers do not need."""
    import subprocess
    import sys

    code = "import sys, slime.engine.hf_server, slime.engine.warm_start; print('fastapi' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_release_and_resume_memory(engine):
    before = gen(engine, PROMPTS[0], max_new_tokens=5)["output_ids"]
    assert engine.post("/release_memory_occupation", json={}).json()["success"]
    r = engine.post("/generate", json={"input_ids": PROMPTS[0]})
    assert r.status_code == 503 and "released" in r.json()["error"]["message"]
    assert engine.get("/health").status_code == 200
    assert engine.get("/health_generate").status_code == 503
    assert engine.post("/resume_memory_occupation", json={"tags": ["weights", "kv_cache"]}).json()["success"]
    assert gen(engine, PROMPTS[0], max_new_tokens=5)["output_ids"] == before


def test_update_weights_from_disk(engine, tiny_model_dir, tiny_model_b_dir, tmp_path):
    other = tiny_model_b_dir
    before = gen(engine, PROMPTS[1], max_new_tokens=8)
    r = engine.post("/update_weights_from_disk", json={"model_path": str(other)})
    assert r.status_code == 200 and r.json()["success"], r.text
    assert engine.get("/get_weight_version").json()["weight_version"] == "1"
    after = gen(engine, PROMPTS[1], max_new_tokens=8)
    assert after["meta_info"]["weight_version"] == "1"
    lps = lambda r: [x[0] for x in r["meta_info"]["output_token_logprobs"]]  # noqa: E731
    assert lps(after) != pytest.approx(lps(before), abs=1e-3)
    assert engine.get("/model_info").json()["model_path"] == str(other)
    bad = engine.post("/update_weights_from_disk", json={"model_path": str(tmp_path / "missing")})
    assert bad.status_code == 400 and not bad.json()["success"]
    # an in-flight request is restarted on the new weights: its whole answer comes from version 7
    results: dict = {}
    th = threading.Thread(target=_background, args=(engine, PROMPTS[0], results, "r"), kwargs=dict(max_new_tokens=400))
    th.start()
    assert until(lambda: load(engine)["num_running_reqs"] == 1, 120)
    restarted = load(engine)["requests_restarted"]
    r = engine.post("/update_weights_from_disk", json={"model_path": str(tiny_model_dir), "weight_version": "7"})
    assert r.json()["success"] and engine.get("/get_weight_version").json()["weight_version"] == "7"
    th.join(300)
    assert load(engine)["requests_restarted"] == restarted + 1
    assert results["r"]["meta_info"]["weight_version"] == "7"
    assert results["r"]["meta_info"]["weight_versions"] == [{"version": "7", "start": 0, "end": 400}]
    assert results["r"]["output_ids"] == gen(engine, PROMPTS[0], max_new_tokens=400)["output_ids"]
    again = gen(engine, PROMPTS[1], max_new_tokens=8)
    assert again["output_ids"] == before["output_ids"] and lps(again) == pytest.approx(lps(before), abs=1e-5)
    # leave the shared engine as the other tests expect it, whatever the order
    engine.post("/update_weights_from_disk", json={"model_path": str(tiny_model_dir), "weight_version": "default"})


def test_default_model_conversion_lock_runs_once(tmp_path, monkeypatch):
    from slime.engine import default_model

    calls = []

    def fake_convert(dst):
        calls.append(dst)
        time.sleep(0.2)  # long enough for the other thread to wait on the lock
        (dst / default_model._DONE_MARKER).write_text("ok\n")

    monkeypatch.setattr(default_model, "_convert", fake_convert)
    with cf.ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda _: default_model.ensure_default_model(tmp_path), range(2)))
    assert len(calls) == 1 and paths[0] == paths[1] == tmp_path / "models" / default_model.MODEL_NAME
    assert [p.name for p in (tmp_path / "models").iterdir() if not p.name.startswith(".")] == [default_model.MODEL_NAME]


@pytest.mark.slow
def test_ensure_default_model_is_a_real_chat_model():
    """Converts SmolLM2 once per machine (~20 s) into $SLIME_CACHE; later runs reuse it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime.engine.default_model import ensure_default_model

    path = ensure_default_model()
    assert ensure_default_model() == path
    assert (path / "model.safetensors").exists() and (path / "tokenizer.json").exists()
    tok = AutoTokenizer.from_pretrained(str(path))
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, return_dict=False
    )
    assert tok.decode(ids).rstrip().endswith("<|im_start|>assistant")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, len(ids) :])
