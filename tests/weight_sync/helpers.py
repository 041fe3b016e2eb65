"""What the weight-sync tests send to the engines and check in their answers (shared by the files of
this package; the fixtures are in its conftest.py)."""

from __future__ import annotations

import concurrent.futures as cf
import os
from types import SimpleNamespace

import pytest
import requests
import torch

from slime.weights.transfer import SHM_PREFIX, shm_dir
from slime.cli.finalize import complete_namespace
from slime.fleet.engine_actor import EngineActor
from slime.fleet.flags import EngineConfig

PROMPTS = [[100 + 7 * i + j for j in range(n)] for i, n in enumerate((3, 11, 5, 17, 8, 2))]
LONG = 128  # tokens per request: long enough to still be running when an update arrives
SHORT = 24  # tokens when only the weights matter (a prefix of the LONG answer: same computation)


def kind(i: int) -> dict:
    """Even prompts greedy, odd ones seeded sampling (the tiny model's greedy output repeats itself)."""
    return {} if i % 2 == 0 else {"temperature": 1.0, "sampling_seed": 1000 + i}


def gen(url: str, ids: list[int], max_new_tokens: int = LONG, **sp) -> dict:
    body = {
        "input_ids": ids,
        "return_logprob": True,
        "sampling_params": {"temperature": 0, "ignore_eos": True, "max_new_tokens": max_new_tokens, **sp},
    }
    r = requests.post(f"{url}/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def load(url: str) -> dict:
    return requests.get(f"{url}/get_load", timeout=30).json()


def actor(model_dir, tmp_path, rank: int = 0, fork_server: str | None = None) -> EngineActor:
    """An engine around a real server process; `fork_server`: started warm from it (as the fleet does)."""
    args = SimpleNamespace(
        engine_host="127.0.0.1",
        rollout_backend="hf",
        hf_checkpoint=str(model_dir),
        engine_max_batch_size=16,
        engine_threads=1,
        engine_startup_timeout=120,
        log_dir=str(tmp_path),
    )
    return EngineActor(EngineConfig.from_args(complete_namespace(args)), rank=rank, fork_server=fork_server)


def hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def all_of(fn, items) -> list:
    with cf.ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(fn, items))


def outputs(r: dict) -> tuple[list[int], list[float]]:
    return r["output_ids"], [x[0] for x in r["meta_info"]["output_token_logprobs"]]


def assert_answer_of(r: dict, ref: dict) -> None:
    ids, lps = outputs(r)
    ref_ids, ref_lps = outputs(ref)
    assert ids == ref_ids[: len(ids)] and len(ids) in (SHORT, LONG)
    assert lps == pytest.approx(ref_lps[: len(ids)], abs=1e-4)


def assert_serves(url: str, refs_of_model: list[dict], version: str, prompts=(0, 1)) -> None:
    for i in prompts:
        r = gen(url, PROMPTS[i], SHORT, **kind(i))
        assert_answer_of(r, refs_of_model[i])
        assert r["meta_info"]["weight_version"] == version
        assert r["meta_info"]["weight_versions"] == [{"version": version, "start": 0, "end": SHORT}]


def ring_files(pid: int | None = None) -> list[str]:
    """This process's (or `pid`'s) shared-memory ring files that still have a name."""
    return sorted(p.name for p in shm_dir().glob(f"{SHM_PREFIX}{pid or os.getpid()}-ring-*"))
