"""slime's files at THUDM/slime@624b824a, unchanged (`tests/upstream_slime/`), run against the embedded
CPU engine on the tiny model (one engine for the module), each through a rollout of our RolloutManager's
controller: `sglang_streaming_rollout.generate_streaming` as `--custom-generate-function-path` (it streams
`/generate` through `slime.utils.http_utils._http_client`, the runtime's `SlimeHttpClient`), and the
rollout-buffer example's whole loop (buffer server, generator processes on `/v1/chat/completions`, its
rollout function fetching trajectories into Samples)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
from urllib.parse import urlsplit

import pytest
import requests

from slime.cli.args import parse_args
from slime.rollout.controller import RolloutController
from slime.rollout.failures import RolloutFailedError
from slime.rollout.debug_data import load_debug_rollout
from slime.rollout.rm_hub import get_deepscaler_rule_based_reward
from slime.utils import http_utils
from slime.testing.until import until
from slime.utils.endpoints import Endpoints
from slime.utils.misc import find_free_port
from slime.utils.types import Sample
from tests.hf_engine_fixtures import run_engine
from tests.conftest import ROOT
from tests.test_upstream_slime_modules import UPSTREAM, load_upstream

STREAMING = "slime.rollout.sglang_streaming_rollout"
EXAMPLE = "slime_plugins.rollout_buffer.rollout_buffer_example"


@pytest.fixture(scope="module")
def engine(tiny_model_dir, engine_fork_server):
    with run_engine(tiny_model_dir, fork_server=engine_fork_server) as url:
        yield url


def streaming_args(tmp_path, url, model):
    where = urlsplit(url)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Count to {i}:", "label": "x"}) + "\n" for i in range(2)))
    return parse_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(model),
            "--prompt-data",
            str(data),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--rm-type",
            "math",
            "--sglang-router-ip",
            where.hostname,
            "--sglang-router-port",
            str(where.port),
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--rollout-max-response-len",
            "6",
            "--rollout-temperature",
            "0",
            "--custom-generate-function-path",
            f"{STREAMING}.generate_streaming",
            "--save-debug-rollout-data",
            str(tmp_path / "rollout_{rollout_id}.pt"),
        ]
    )


def test_slimes_streaming_rollout_runs_unchanged_through_a_rollout(tmp_path, engine, tiny_model_dir, monkeypatch):
    load_upstream(monkeypatch, "slime/rollout/sglang_streaming_rollout.py", STREAMING)
    args = streaming_args(tmp_path, engine, tiny_model_dir)
    assert http_utils._http_client is None  # as slime's before its RolloutManager calls init_http_client
    controller = RolloutController(args, Endpoints(engine, [engine]))
    try:
        assert http_utils._http_client is controller.runtime.slime_http
        batch = controller.generate(0)
        progress = controller.runtime.progress.as_dict()
        stats = controller.runtime.client.stats
    finally:
        controller.close()
    assert http_utils._http_client is None  # the controller's closed with it

    samples = load_debug_rollout(str(tmp_path / "rollout_{rollout_id}.pt"), 0)
    assert len(samples) == 4 and len(batch["tokens"]) == 4
    tok = controller.runtime.tokenizer
    for s in samples:
        prompt = tok(s.prompt, add_special_tokens=False)["input_ids"]
        answer = requests.post(
            f"{engine}/generate",
            timeout=120,
            json={
                "input_ids": prompt,
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 6, "temperature": 0},
            },
        ).json()
        want = [t for _, t, *_ in answer["meta_info"]["output_token_logprobs"]]
        # token-exact: the streamed ids are the engine's, appended to the prompt, one log-prob each
        assert s.tokens == prompt + want and s.response_length == len(want) == len(s.rollout_log_probs)
        assert s.rollout_log_probs == pytest.approx(
            [lp for lp, *_ in answer["meta_info"]["output_token_logprobs"]], abs=1e-4
        )
        assert all(math.isfinite(lp) and lp <= 0 for lp in s.rollout_log_probs)
        assert s.loss_mask == [1] * len(want) and s.response == answer["text"]
        assert (
            s.status
            == {"length": Sample.Status.TRUNCATED, "stop": Sample.Status.COMPLETED}[
                answer["meta_info"]["finish_reason"]["type"]
            ]
        )
        spans = [e for e in s.trace["events"] if e["name"] == "sglang_generate_stream"]
        assert [e["type"] for e in spans] == ["span_start", "span_end"]
        assert spans[1]["attrs"]["completion_tokens"] == len(want)
    # the streams went through the engine client's bound and counters like our own requests
    assert progress["responses"] == 4 and progress["tokens"] == sum(s.response_length for s in samples)
    assert stats.requests == 4 and stats.failures == 0


def test_a_stream_that_fails_is_a_failed_sample_not_a_crashed_rollout(tmp_path, tiny_model_dir, monkeypatch):
    """slime's streaming rollout raises whatever httpx raises; through our client it is an `HttpError`,
    which the rollout loop turns into FAILED samples, counted by reason (nothing listens on the port)."""
    load_upstream(monkeypatch, "slime/rollout/sglang_streaming_rollout.py", STREAMING)
    nowhere = f"http://127.0.0.1:{find_free_port()}"
    controller = RolloutController(streaming_args(tmp_path, nowhere, tiny_model_dir), Endpoints(nowhere, [nowhere]))
    try:
        with pytest.raises(RolloutFailedError) as e:
            controller.generate(0)
        stats = controller.runtime.client.stats
    finally:
        controller.close()
    assert e.value.reasons == {"connection": 4} and stats.failure_reasons == {"connection": 4}
    assert controller.runtime.client.in_flight == 0


BUFFER_SERVER = """import sys
sys.path.append({upstream!r})
import uvicorn
from slime_plugins.rollout_buffer.buffer import app
uvicorn.run(app, host="127.0.0.1", port={port}, log_level="warning")
"""


@pytest.fixture
def buffer_server(tmp_path):
    """slime's rollout-buffer server (`buffer.py`'s app, unchanged) in a process group of its own, on
    loopback and a free port (its `__main__` binds 0.0.0.0:8889); the generator processes it forks die
    with the group."""
    port = find_free_port()
    log = (tmp_path / "buffer.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-c", BUFFER_SERVER.format(upstream=str(UPSTREAM), port=port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        assert until(lambda: proc.poll() is not None or _answers(url), timeout=120) and proc.poll() is None, (
            tmp_path / "buffer.log"
        ).read_text()
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def within(seconds: float, fn, *args, what):
    """`fn(*args)` in a daemon thread, failing the test after `seconds` instead of hanging the suite."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True, name="bounded-call")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"no answer within {seconds} s: {what()}")
    if "error" in box:
        raise box["error"]
    return box["value"]


def buffer_log(tmp_path) -> str:
    return (tmp_path / "buffer.log").read_text()[-3000:] if (tmp_path / "buffer.log").is_file() else ""


def _answers(url: str) -> bool:
    try:
        return requests.post(f"{url}/get_rollout_data", json={}, timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


def test_slimes_rollout_buffer_example_runs_its_loop(tmp_path, engine, tiny_model_dir, buffer_server, monkeypatch):
    """The whole loop of slime's rollout-buffer example, unchanged: its rollout function (run by our
    RolloutManager's controller) starts the buffer's generator with the data source's metadata, the
    generator's worker processes query the engine's `/v1/chat/completions` through the OpenAI client and
    grade the answers, write them to the buffer, and the rollout function fetches a finished group and
    turns it into Samples (tokens from the chat template of the messages, as slime's example does)."""
    monkeypatch.syspath_prepend(
        str(UPSTREAM)
    )  # `slime` itself is imported already: only slime_plugins comes from there
    where = urlsplit(engine)
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": [{"role": "user", "content": f"What is {i}+1?"}], "label": str(i + 1)}) + "\n"
            for i in range(2)
        )
    )
    args = parse_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(data),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--sglang-router-ip",
            where.hostname,
            "--sglang-router-port",
            str(where.port),
            "--rollout-function-path",
            f"{EXAMPLE}.generate_rollout",
            "--rollout-buffer-url",
            buffer_server,
            "--rollout-task-type",
            "math",
            "--rollout-batch-size",
            "1",
            "--n-samples-per-prompt",
            "2",
            "--rollout-max-response-len",
            "8",
            "--save-debug-rollout-data",
            str(tmp_path / "rollout_{rollout_id}.pt"),
        ]
    )
    args.rollout_num_process = 2  # the example's own knob (`getattr(args, "rollout_num_process", 100)`)
    controller = RolloutController(args, Endpoints(engine, [engine]))
    try:
        batch = within(
            300,
            controller.generate,
            0,
            what=lambda: (
                "slime's rollout-buffer example (it polls the "
                f"buffer until a group is there, with no deadline of its own); buffer log:\n{buffer_log(tmp_path)}"
            ),
        )
        metadata = controller.data_source.get_metadata()
    finally:
        controller.close()
        for name in [m for m in sys.modules if m == "slime_plugins" or m.startswith("slime_plugins.")]:
            monkeypatch.delitem(sys.modules, name)

    samples = load_debug_rollout(str(tmp_path / "rollout_{rollout_id}.pt"), 0)
    assert len(samples) == 2 == len(batch["tokens"]) and samples[0].index == samples[1].index  # one group
    assert metadata == {"0": []}  # the example's `update_metadata` (finished groups of rollout 0), on our data source
    tok = controller.runtime.tokenizer
    assert batch["tokens"] == [s.tokens for s in samples]
    for s in samples:
        question, answer = s.metadata["messages"]  # what the generator's worker wrote to the buffer
        assert question == {"role": "user", "content": f"What is {s.index}+1?"}
        assert s.metadata["label"] == str(s.index + 1)
        assert answer["role"] == "assistant" and answer["content"]  # the engine's, through /v1/chat/completions
        assert s.reward == get_deepscaler_rule_based_reward(answer["content"], s.metadata["label"])
        assert s.status == (
            Sample.Status.TRUNCATED if s.metadata["finish_reason"] == "length" else Sample.Status.COMPLETED
        )
        # the example's tokens: the conversation through the chat template, the answer turn trained
        assert tok.decode(s.tokens[: -s.response_length]) == tok.apply_chat_template(
            [question], tokenize=False, add_generation_prompt=True
        )
        assert tok.decode(s.tokens[-s.response_length :]) == answer["content"] + "<|im_end|>\n"
        assert s.loss_mask == [1] * s.response_length
