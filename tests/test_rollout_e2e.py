"""The rollout service end to end on a CPU box: real Ray, the real sglang-router, two embedded
engines serving the tiny model. Exact tokens and log-probs, group-normalised rewards, debug
save/load, external router, router restart, engine kill mid-rollout, clean failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import requests
import torch

from slime.rollout.debug_data import load_debug_rollout
from slime.cli.args import parse_args

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_PROMPTS, N_SAMPLES, MAX_LEN = 3, 2, 12


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    rows = [
        {"messages": [{"role": "user", "content": f"What is {i} plus {i}?"}], "label": str(2 * i)} for i in range(8)
    ]
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    return d


def base_argv(tiny_model_dir, data_files, tmp, *extra):
    return [
        "--rollout-backend",
        "hf",
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--prompt-data",
        str(data_files / "train.jsonl"),
        "--input-key",
        "messages",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rollout-num-engines",
        "2",
        "--rollout-num-cpus-per-engine",
        "0.5",
        "--engine-threads",
        "1",
        "--rollout-batch-size",
        str(N_PROMPTS),
        "--n-samples-per-prompt",
        str(N_SAMPLES),
        "--rollout-max-response-len",
        str(MAX_LEN),
        "--log-dir",
        str(tmp / "logs"),
        *extra,
    ]


@pytest.fixture(scope="module")
def manager(ray_cluster, engine_fork_server, tiny_model_dir, data_files, tmp_path_factory):
    import ray

    from slime.testing.fault_manager import FaultInjectingManager

    tmp = tmp_path_factory.mktemp("e2e")
    args = parse_args(
        base_argv(
            tiny_model_dir,
            data_files,
            tmp,
            "--custom-rm-path",
            "tests.plugins.rewards.token_parity_rm",
            "--save-debug-rollout-data",
            str(tmp / "debug" / "rollout_{rollout_id}.pt"),
            "--save-debug-train-data",
            str(tmp / "debug" / "train_{rollout_id}.pt"),
            "--eval-prompt-data",
            "mini",
            str(data_files / "eval.jsonl"),
            "--n-samples-per-eval-prompt",
            "2",
            "--use-wandb",
            "--wandb-dir",
            str(tmp / "wandb"),
            "--rollout-data-dir",
            str(tmp / "dumps"),
        )
    )
    m = ray.remote(FaultInjectingManager).options(num_cpus=0, max_concurrency=8).remote(args, engine_fork_server)
    info = ray.get(m.start.remote())
    yield m, info, tmp, args
    ray.get(m.shutdown.remote())


def teacher_forced_logprobs(model, tokens, prompt_len):
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[i - 1, tokens[i]].item() for i in range(prompt_len, len(tokens))]


def test_batch_is_exactly_what_the_engines_sampled(manager, tiny_model_dir):
    import ray
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m, info, tmp, args = manager
    assert len(info["engine_urls"]) == 2
    batch = ray.get(ray.get(m.generate.remote(0)).inner)
    n = N_PROMPTS * N_SAMPLES
    assert set(batch) >= {
        "tokens",
        "response_lengths",
        "rewards",
        "raw_reward",
        "truncated",
        "sample_indices",
        "loss_masks",
        "rollout_log_probs",
    }
    assert all(len(v) == n for v in batch.values())
    # consecutive fresh indices (other tests on this module's manager may have drawn samples before)
    first = min(batch["sample_indices"])
    assert sorted(batch["sample_indices"]) == list(range(first, first + n))
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)  # once, not per sample
    samples = load_debug_rollout(args.save_debug_rollout_data, 0)
    by_index = {s.index: s for s in samples}
    for i in range(n):
        s = by_index[batch["sample_indices"][i]]
        prompt = tok.apply_chat_template(s.metadata["messages"], tokenize=False, add_generation_prompt=True)
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        tokens, rl = batch["tokens"][i], batch["response_lengths"][i]
        assert tokens[: len(prompt_ids)] == prompt_ids and len(tokens) == len(prompt_ids) + rl
        assert batch["loss_masks"][i] == [1] * rl and len(batch["rollout_log_probs"][i]) == rl
        # the log-probs are the engine's own for exactly these tokens (temperature 1)
        expect = teacher_forced_logprobs(model, tokens, len(prompt_ids))
        assert batch["rollout_log_probs"][i] == pytest.approx(expect, abs=2e-3)
        # status from finish reason: hitting the length limit is TRUNCATED
        assert batch["truncated"][i] == (1 if rl == MAX_LEN and s.metadata["finish_reason"] == "length" else 0)
        assert batch["raw_reward"][i] == float(sum(tokens[len(prompt_ids) :]) % 3)
    # GRPO: normalised within each group, never across the batch
    groups = {}
    for i, idx in enumerate(batch["sample_indices"]):
        groups.setdefault(by_index[idx].group_index, []).append(i)
    assert len(groups) == N_PROMPTS
    for members in groups.values():
        raw = [batch["raw_reward"][i] for i in members]
        mean = sum(raw) / len(raw)
        std = (sum((r - mean) ** 2 for r in raw) / (len(raw) - 1)) ** 0.5
        for i in members:
            assert batch["rewards"][i] == pytest.approx((batch["raw_reward"][i] - mean) / (std + 1e-6))
    # both engines served requests through the router
    for url in info["engine_urls"]:
        assert requests.get(f"{url}/metrics", timeout=5).text.count("sglang:num_requests_total") >= 1
        load = requests.get(f"{url}/metrics", timeout=5).text
        served = [
            float(line.rsplit(" ", 1)[1]) for line in load.splitlines() if line.startswith("sglang:num_requests_total")
        ]
        assert served and served[0] > 0
    summary = ray.get(m.last_summary.remote())
    assert summary["samples"] == n and summary["rollout_id"] == 0
    # the rollout dump holds every sample, in the documented schema
    from slime.observability.rollout_dump import validate_line

    lines = (tmp / "dumps" / "0.jsonl").read_text().splitlines()
    assert len(lines) == n
    rec = validate_line(lines[0])
    assert rec.step == 0 and rec.response_length == len(rec.tokens) - rec.prompt_length


def test_debug_round_trip_without_engines(manager, ray_cluster, tiny_model_dir, data_files):
    """The saved rollout replays without engines into the identical batch; the replaying manager's one wandb
    run holds the rollout's metrics once it is shut down."""
    import ray

    from slime.observability import wandb_reader
    from slime.ray.rollout_manager import RolloutManager

    m, info, tmp, args = manager
    ray.get(ray.get(m.generate.remote(7)).inner)
    saved = torch.load(tmp / "debug" / "train_7.pt", weights_only=True)["data"]
    replay_args = parse_args(
        base_argv(
            tiny_model_dir,
            data_files,
            tmp,
            "--custom-rm-path",
            "tests.plugins.rewards.token_parity_rm",
            "--load-debug-rollout-data",
            args.save_debug_rollout_data,
            "--use-wandb",
            "--wandb-dir",
            str(tmp / "replay-wandb"),
        )
    )
    r = ray.remote(RolloutManager).options(num_cpus=0).remote(replay_args)
    try:
        replay_info = ray.get(r.start.remote())
        assert replay_info["engine_urls"] == [] and replay_info["router_url"] is None
        batch = ray.get(ray.get(r.generate.remote(7)).inner)
        assert batch == saved
    finally:
        ray.get(r.shutdown.remote())
    [run_dir] = wandb_reader.find_run_dirs(tmp / "replay-wandb")
    assert wandb_reader.wait_closed(run_dir)
    rows = wandb_reader.read_history(run_dir)
    keys = set().union(*rows)
    assert {
        "rollout/reward_mean",
        "rollout/truncated_ratio",
        "perf/rollout_time",
        "perf/tokens_per_s",
        "perf/engine_retries",
    } <= keys
    raw = saved["raw_reward"]
    assert [row["rollout/reward_mean"] for row in rows if "rollout/reward_mean" in row] == [
        pytest.approx(sum(raw) / len(raw))
    ]


def test_status_answers_while_rollout_runs_and_eval(manager):
    import ray

    m, _, _, _ = manager
    ref = m.generate.remote(1)
    seen = set()
    while True:
        ready, _ = ray.wait([ref], timeout=0.05)
        st = ray.get(m.status.remote())
        seen.add(st["phase"])
        assert st["router_url"]
        if ready:
            break
    ray.get(ref)
    assert "rollout" in seen
    result = ray.get(m.eval.remote(1))
    assert result["mini"]["samples"] == 4 and 0 <= result["mini"]["truncated_ratio"] <= 1


def test_offload_onload_really_release(manager):
    import ray

    m, info, _, _ = manager
    ray.get(m.offload.remote())
    url = info["engine_urls"][0]
    r = requests.post(f"{url}/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 503
    ray.get(m.onload.remote())
    r = requests.post(f"{url}/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200


def test_router_restarts_after_kill(manager):
    """The router is SIGKILLed while requests wait on the (paused) engines: it is restarted, the
    orphaned requests are re-sent with fresh rids (the old ones aborted) and nothing fails."""
    import ray

    m, info, _, _ = manager
    old = ray.get(m.router_pid.remote())
    restarts = ray.get(m.status.remote())["router_restarts"]
    urls = info["engine_urls"]
    for url in urls:
        requests.post(f"{url}/pause_generation", json={}, timeout=10)
    try:
        ref = m.generate.remote(2)
        deadline = time.monotonic() + 60
        while sum(requests.get(f"{u}/get_load", timeout=5).json().get("num_reqs", 0) for u in urls) == 0:
            assert time.monotonic() < deadline, "no request reached the paused engines"
            time.sleep(0.05)
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while ray.get(m.status.remote())["router_restarts"] == restarts:
            assert time.monotonic() < deadline, "the router was not restarted"
            time.sleep(0.05)
    finally:
        for url in urls:
            requests.post(f"{url}/continue_generation", json={}, timeout=10)
    batch = ray.get(ray.get(ref).inner)
    assert len(batch["tokens"]) == N_PROMPTS * N_SAMPLES
    summary = ray.get(m.last_summary.remote())
    assert summary["failed"] == 0 and summary["engine_retries"] >= 1
    st = ray.get(m.status.remote())
    assert st["router_restarts"] == restarts + 1 and st["router_pid"] != old
    assert ray.get(m.router_alive.remote())


@pytest.fixture
def own_manager(ray_cluster, engine_fork_server, tiny_model_dir, data_files, tmp_path):
    """A manager of its own, for a test that breaks it."""
    import ray

    from slime.testing.fault_manager import FaultInjectingManager

    args = parse_args(base_argv(tiny_model_dir, data_files, tmp_path, "--rm-type", "exact"))
    m = ray.remote(FaultInjectingManager).options(num_cpus=0, max_concurrency=8).remote(args, engine_fork_server)
    try:
        info = ray.get(m.start.remote())
        yield m, info
    finally:
        ray.get(m.shutdown.remote())


def test_engine_killed_mid_rollout_loses_nothing(own_manager):
    """Engine 0 is paused so requests pile up on it, then killed: they are retried on engine 1, the
    death is reported, and engine 0 is replaced (new actor, new URL) and serves again."""
    import ray

    m, info = own_manager
    victim = info["engine_urls"][0]
    requests.post(f"{victim}/pause_generation", json={}, timeout=10)
    ref = m.generate.remote(3)
    deadline = time.monotonic() + 60
    while requests.get(f"{victim}/get_load", timeout=5).json().get("num_reqs", 0) == 0:
        assert time.monotonic() < deadline, "no request reached the paused engine"
        time.sleep(0.05)
    old_pid = ray.get(m.kill_engine.remote(0))
    batch = ray.get(ray.get(ref).inner)
    n = N_PROMPTS * N_SAMPLES
    assert len(batch["tokens"]) == n and sorted(batch["sample_indices"]) == sorted(set(batch["sample_indices"]))
    summary = ray.get(m.last_summary.remote())
    assert summary["samples"] == n and summary["failed"] == 0 and summary["engine_retries"] >= 1
    assert summary["engine_deaths"] == 1
    # replaced while the run goes on: a new server on a new port, registered with the router
    deadline = time.monotonic() + 180
    while (st := ray.get(m.status.remote()))["engines"][0]["state"] != "healthy":
        assert st["engines"][0]["state"] in ("dead", "restarting"), st["engines"]
        assert time.monotonic() < deadline, f"engine 0 was not replaced: {st['engines']}"
        time.sleep(0.1)
    engine0 = st["engines"][0]
    assert engine0["restarts"] == 1 and engine0["deaths"] == 1 and engine0["url"] != victim
    assert sorted(st["engine_urls"]) == sorted([engine0["url"], info["engine_urls"][1]])
    assert st["engine_deaths"] == 1 and st["engine_restarts"] == 1
    assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == psutil.STATUS_ZOMBIE
    ray.get(ray.get(m.generate.remote(4)).inner)
    served = requests.get(f"{engine0['url']}/metrics", timeout=5).text
    assert any(
        line.startswith("sglang:num_requests_total") and float(line.rsplit(" ", 1)[1]) > 0
        for line in served.splitlines()
    )
    summary = ray.get(m.last_summary.remote())
    assert summary["failed"] == 0 and summary["engine_deaths"] == 0


def test_external_router_mode_and_the_managers_own_sandbox_and_limiter_for_tools(
    ray_cluster, engine_fork_server, tiny_model_dir, data_files, tmp_path
):
    """An external router (`--sglang-router-ip/port`): the manager registers its engine with it and never stops
    it. `sandbox_fusion_url: local`: the manager starts one sandbox and the tool's global limiter; tool calls
    made inside the controller actor run in that sandbox, stopped with the manager. (One manager for both:
    they are independent.)"""
    import ray

    from slime.fleet.router import Router
    from slime.ray.rollout_manager import RolloutManager
    from slime.tools.rate_limiter import get_rate_limiter

    router = Router().start()
    try:
        args = parse_args(
            base_argv(
                tiny_model_dir,
                data_files,
                tmp_path,
                "--rm-type",
                "exact",
                "--rollout-num-engines",
                "1",
                "--sglang-router-ip",
                router.host,
                "--sglang-router-port",
                str(router.port),
                "--tool-config-path",
                os.path.join(ROOT, "configs", "sandbox_fusion_tool.yaml"),
                "--custom-generate-function-path",
                "tests.plugins.sandbox_probe.generate",
                "--chat-template-check",
                "warn",
                "--max-turns",
                "1",
                "--save-debug-rollout-data",
                str(tmp_path / "r_{rollout_id}.pt"),
            )
        )
        m = ray.remote(RolloutManager).options(num_cpus=0).remote(args, engine_fork_server)
        try:
            info = ray.get(m.start.remote())
            assert info["router_url"] == router.url and info["router_pid"] is None
            assert [w.url for w in router.list_workers()] == info["engine_urls"]
            url = info["sandbox_url"]
            assert url and requests.get(f"{url}/v1/ping", timeout=5).ok
            assert info["rate_limiters"] == ["tool:code_interpreter"]
            batch = ray.get(ray.get(m.generate.remote(0)).inner)
            assert len(batch["tokens"]) == N_PROMPTS * N_SAMPLES
            samples = load_debug_rollout(args.save_debug_rollout_data, 0)
            assert len(samples) == N_PROMPTS * N_SAMPLES
            assert all(s.metadata["probe"] == f"{s.index * 7}\n" for s in samples)
            assert get_rate_limiter("tool:code_interpreter") is not None
        finally:
            ray.get(m.shutdown.remote())
        assert router.alive()  # we never stop a router we did not start
        with pytest.raises(requests.ConnectionError):  # but the sandbox we started is gone
            requests.get(f"{url}/v1/ping", timeout=5)
    finally:
        router.stop()


@pytest.mark.slow
def test_embedded_model_tool_calls_run_in_sandbox(ray_cluster, engine_fork_server, tmp_path):
    """The real default model (SmolLM2, greedy) on the embedded engine emits a tool call; it runs in
    the manager's local sandbox and the result comes back as masked tool tokens."""
    import ray
    from transformers import AutoTokenizer

    from slime.engine.default_model import ensure_default_model
    from slime.ray.rollout_manager import RolloutManager

    model = str(ensure_default_model())
    call = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'
    shots = [{"role": "system", "content": "You call tools. To run code, answer with exactly one <tool_call> block."}]
    for _ in range(2):
        shots += [
            {"role": "user", "content": "Run print(6 * 7)."},
            {"role": "assistant", "content": "Running it.\n" + call + "\nDone."},
        ]
    shots.append({"role": "user", "content": "Run print(6 * 7)."})
    data = tmp_path / "calls.jsonl"
    data.write_text(json.dumps({"messages": shots, "label": "42"}) + "\n")
    args = parse_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            model,
            "--prompt-data",
            str(data),
            "--input-key",
            "messages",
            "--label-key",
            "label",
            "--rollout-num-engines",
            "1",
            "--engine-threads",
            "1",
            "--rollout-batch-size",
            "1",
            "--n-samples-per-prompt",
            "1",
            "--rollout-temperature",
            "0",
            "--rollout-max-response-len",
            "96",
            "--rm-type",
            "exact",
            "--rollout-function-path",
            "rollout_plugins.multi_turn.generate_rollout",
            "--tool-config-path",
            os.path.join(ROOT, "configs", "sandbox_fusion_tool.yaml"),
            "--chat-template-check",
            "warn",
            "--max-turns",
            "2",
            "--log-dir",
            str(tmp_path / "logs"),
            "--save-debug-rollout-data",
            str(tmp_path / "r_{rollout_id}.pt"),
        ]
    )
    m = ray.remote(RolloutManager).options(num_cpus=0).remote(args, engine_fork_server)
    try:
        info = ray.get(m.start.remote())
        batch = ray.get(ray.get(m.generate.remote(0)).inner)
        stats = requests.get(f"{info['sandbox_url']}/v1/stats", timeout=5).json()
    finally:
        ray.get(m.shutdown.remote())
    [s] = load_debug_rollout(args.save_debug_rollout_data, 0)
    assert s.metadata["tool_calls"] == {"code_interpreter": 1}, s.response
    assert s.metadata["tool_errors"] == []
    # turn 1's call ran; whatever the model does in its last turn (another call cut off by the
    # length limit, say) is recorded, never executed half-way
    assert all(e["turn"] > 1 for e in s.metadata["parse_errors"])
    tool_spans = [x for x in s.metadata["turn_spans"] if x["role"] == "tool"]
    assert len(tool_spans) == 1
    tok = AutoTokenizer.from_pretrained(model)
    resp = s.tokens[s.prompt_length :]
    tool_text = tok.decode(resp[tool_spans[0]["start"] : tool_spans[0]["end"]])
    assert "42" in tool_text  # what the sandbox printed, rendered as the tool turn
    assert batch["loss_masks"][0] == s.loss_mask
    assert set(s.loss_mask[tool_spans[0]["start"] : tool_spans[0]["end"]]) == {0}
    assert set(s.loss_mask[: tool_spans[0]["start"]]) == {1}
    assert stats["total"] == 1 and stats["isolation"]  # exactly the one call, run isolated


def _procs_with(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in c for c in (p.info["cmdline"] or [])):
                out.append(p)
        except psutil.Error:
            pass
    return out


def test_engine_that_fails_to_start_reports_log_and_leaves_nothing(ray_cluster, tmp_path, data_files):
    import ray
    from ray.util.placement_group import placement_group_table

    from slime.ray.rollout_manager import RolloutManager

    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{ this is not json")
    args = parse_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(broken),
            "--prompt-data",
            str(data_files / "train.jsonl"),
            "--input-key",
            "messages",
            "--rollout-num-engines",
            "2",
            "--engine-startup-timeout",
            "120",
            "--log-dir",
            str(tmp_path / "logs"),
        ]
    )
    before = {pg_id for pg_id, pg in placement_group_table().items() if pg["state"] != "REMOVED"}
    m = ray.remote(RolloutManager).options(num_cpus=0).remote(args)
    with pytest.raises(ray.exceptions.RayTaskError) as e:
        ray.get(m.start.remote())
    msg = str(e.value)
    assert "EngineStartError" in msg and "process exited with code" in msg and "--- last" in msg
    assert str(broken) in msg  # the log tail names what it failed to load
    assert _procs_with(str(broken)) == []
    after = {pg_id for pg_id, pg in placement_group_table().items() if pg["state"] != "REMOVED"}
    assert after <= before


def test_ctrl_c_stops_everything(tiny_model_dir, data_files, tmp_path):
    logs = tmp_path / "ctrlc-logs"
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slime",
            *base_argv(
                tiny_model_dir,
                data_files,
                tmp_path,
                "--rm-type",
                "exact",
                "--num-rollout",
                "1000",
                "--log-dir",
                str(logs),
            ),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("rollout 0:"):
            break
    else:
        pytest.fail("slime never reported a rollout:\n" + "".join(lines[-40:]))
    started = psutil.Process(proc.pid).children(recursive=True)
    cmdlines = [" ".join(p.cmdline()) for p in started]
    assert sum("slime.engine.hf_server" in c for c in cmdlines) == 2
    assert sum("sglang::router" in c or "sglang_router.launch_router" in c for c in cmdlines) == 1
    assert any("raylet" in c for c in cmdlines) and any("gcs_server" in c for c in cmdlines)  # Ray's own too
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(lines[-20:]) + out[-3000:]
    assert "interrupted" in out
    _, alive = psutil.wait_procs(started, timeout=30)
    assert [" ".join(p.cmdline()) for p in alive] == []


def test_bad_plugin_path_fails_before_starting_anything(tiny_model_dir, data_files, tmp_path, capsys):
    from slime.cli.rollout import main

    rc = main(base_argv(tiny_model_dir, data_files, tmp_path, "--rollout-function-path", "no_such.module.fn"))
    err = capsys.readouterr().err
    assert rc == 1 and "--rollout-function-path 'no_such.module.fn'" in err and "No module named 'no_such'" in err


def test_trainer_gets_one_box_per_dp_rank(ray_cluster, engine_fork_server, tiny_model_dir, data_files, tmp_path):
    """slime's trainer contract end to end: after set_train_parallel_config({"dp_size": 2}) every
    generate returns two Boxes whose partitions cover every sample once, with the samples' exact
    tokens, masks and log-probs as CPU tensors; the plugin (slime-style) never sets loss_mask."""
    import ray

    from slime.ray.rollout_manager import RolloutManager

    args = parse_args(
        base_argv(
            tiny_model_dir,
            data_files,
            tmp_path,
            "--rollout-num-engines",
            "1",
            "--rollout-function-path",
            "tests.plugins.slime_style_rollout.generate_rollout",
            "--save-debug-rollout-data",
            str(tmp_path / "r_{rollout_id}.pt"),
            "--global-batch-size",
            "2",
            "--micro-batch-size",
            "1",
        )
    )
    m = ray.remote(RolloutManager).options(num_cpus=0).remote(args, engine_fork_server)
    try:
        ray.get(m.start.remote())
        with pytest.raises(ray.exceptions.RayTaskError, match="dp_size"):
            ray.get(m.set_train_parallel_config.remote({}))
        ray.get(m.set_train_parallel_config.remote({"dp_size": 2}))
        boxes = ray.get(m.generate.remote(0))
        assert isinstance(boxes, list) and len(boxes) == 2
        ranks = [ray.get(b.inner) for b in boxes]
    finally:
        ray.get(m.shutdown.remote())
    samples = load_debug_rollout(str(tmp_path / "r_{rollout_id}.pt"), 0)
    n = N_PROMPTS * N_SAMPLES
    assert len(samples) == n and all(s.loss_mask is None for s in samples)
    assert sorted(i for r in ranks for i in r["partition"]) == list(range(n))
    for r in ranks:
        assert r["global_batch_sizes"] == [2] * (n // 2) and len(r["num_microbatches"]) == n // 2
        assert sum(len(mb) for mb in r["micro_batch_indices"]) == len(r["partition"])
        assert r["rollout_mask_sums"].dtype == torch.float32
        for j, i in enumerate(r["partition"]):
            s = samples[i]
            assert r["tokens"][j].dtype == torch.int64 and r["tokens"][j].tolist() == s.tokens
            assert r["loss_masks"][j].tolist() == [1] * s.response_length  # None became ones
            assert r["rollout_log_probs"][j].dtype == torch.float32
            assert r["rollout_log_probs"][j].tolist() == pytest.approx(s.rollout_log_probs, abs=1e-6)
        assert len(r["raw_reward"]) == n and len(r["total_lengths"]) == n
