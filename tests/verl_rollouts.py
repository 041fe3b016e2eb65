"""Drives verl's configs and recipe rows through the real multi-turn stack: a scripted engine behind the
real router answers each turn as a test scripts it, and `rollout` checks the sample's exact tokens,
masks and log-probs and what the engine was sent (tests/test_verl_yamls.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from slime.rollout.flags import PromptConfig
from slime.utils.plugin_args import completed

DATA = Path(__file__).resolve().parent / "data" / "verl"
IM_END = 151645
PARAMS = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "max_new_tokens": 512,
    "skip_special_tokens": False,
    "no_stop_trim": True,
}


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from slime.testing.tiny_model import qwen_tokenizer_dir

    return AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))


@pytest.fixture(scope="module")
def stack(tok, tmp_path_factory):
    """A scripted engine behind the real router; `scripts[key]` answers the prompt containing `key`,
    turn by turn (the engine finds the key in the decoded input, so verl's prompts stay unmarked)."""
    from slime.fleet.router import Router
    from slime.testing.scripted_engine import ScriptedEngine
    from slime.testing.tiny_model import qwen_tokenizer_dir

    scripts: dict[str, list[dict[str, Any]]] = {}

    def script(body: dict) -> dict:
        text = tok.decode(body["input_ids"], skip_special_tokens=False)
        key = next(k for k in reversed(scripts) if k in text)  # the latest test's (rows may share text)
        return scripts[key][text.count("<|im_start|>assistant") - 1]

    engine = ScriptedEngine(script, str(qwen_tokenizer_dir())).start()
    router = Router(log_dir=str(tmp_path_factory.mktemp("router"))).start()
    router.add_worker(engine.url)
    yield {"router": router, "engine": engine, "scripts": scripts, "model": str(qwen_tokenizer_dir())}
    router.stop()
    engine.stop()


def say(tok, text: str, lp0: float) -> dict[str, Any]:
    ids = tok.encode(text, add_special_tokens=False) + [IM_END]
    return {"output_ids": ids, "finish_type": "stop", "log_probs": [lp0 - 0.001 * i for i in range(len(ids))]}


def call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def tool_delta(tok, content: str) -> list[int]:
    """What Qwen3's template inserts after an assistant turn that ended with <|im_end|>, written out by hand."""
    return tok.encode(
        f"\n<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )


def recipe_sample(stack, tok, recipe: str, tmp_path: Path, tool_config: Path | None, rm_type: str | None, **flags: Any):
    """(args, sample) for the recipe's row written as verl writes it (parquet), read with verl's keys;
    `flags` set more of the multi-turn flags (interactions)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from slime.rollout.data_source import read_rows, sample_from_row
    from slime.testing.runtime import bind_runtime
    from slime.tools.flags import tool_defaults

    rows = [json.loads(line) for line in (DATA / "rows" / f"{recipe}.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    args = argparse.Namespace(
        **{
            **tool_defaults(),
            "sglang_router_ip": "127.0.0.1",
            "sglang_router_port": stack["router"].port,
            "hf_checkpoint": stack["model"],
            "rollout_max_response_len": 512,
            "rollout_max_context_len": None,
            "sglang_server_concurrency": 8,
            "request_timeout": 30.0,
            "request_max_retries": 0,
            "tool_config_path": tool_config and str(tool_config),
            "rm_type": rm_type,
            "custom_rm_path": None,
            "group_rm": False,
            "tool_reward_mode": "add" if rm_type else "none",
            "tool_key": "extra_info.tools_kwargs",
            "metadata_key": None,
            "apply_chat_template": False,
            **flags,
        }
    )
    bind_runtime(args, tokenizer=tok)
    row = read_rows(tmp_path / "train.parquet")[0]
    sample = sample_from_row(
        PromptConfig.from_args(completed(args)),
        row,
        f"{recipe}:1",
        "prompt",
        "reward_model.ground_truth",
        tokenize=False,
    )
    return args, sample, row


async def rollout(stack, tok, args, sample, row, key: str, turns: list[str], deltas: list[list[int]]):
    """One multi-turn sample whose assistant turns say `turns`, each followed by the masked tokens
    `deltas[i]` (tool results or a user turn; none after the last): exact tokens, masks (the model's
    tokens 1, the rest 0) and log-probs, and the engine sent exactly the growing trajectory each turn."""
    from rollout_plugins.multi_turn import MultiTurnContext, generate
    from slime.rollout.runtime import current, unbind
    from slime.rollout.runtime import close_tool_sets

    outs = [say(tok, text, -1.0 - t) for t, text in enumerate(turns)]
    stack["scripts"].pop(key, None)
    stack["scripts"][key] = outs
    n0 = len(stack["engine"].requests)
    names = list(row["extra_info"].get("tools_kwargs") or [])
    schemas = MultiTurnContext.get(args).tools.schemas(names)
    try:
        s = await generate(args, sample, dict(PARAMS))
    finally:  # the run's HTTP sessions (engine client, tools) closed on the loop they ran on
        runtime = current(args)
        await runtime.client.close()
        await close_tool_sets()  # the runtime's, before it is unbound
        unbind(runtime)
    prompt = tok.encode(
        tok.apply_chat_template(row["prompt"], tools=schemas or None, tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )
    tokens, mask, log_probs, sent = list(prompt), [], [], []
    for out, delta in zip(outs, deltas + [[]]):
        sent.append(list(tokens))
        tokens += out["output_ids"] + delta
        mask += [1] * len(out["output_ids"]) + [0] * len(delta)
        log_probs += out["log_probs"] + [0.0] * len(delta)
    assert s.tokens == tokens and s.loss_mask == mask and s.rollout_log_probs == pytest.approx(log_probs)
    assert s.prompt_length == len(prompt) and s.response_length == len(tokens) - len(prompt)
    assert [r["input_ids"] for r in stack["engine"].requests[n0:]] == sent
    return s


async def run_turns(stack, tok, args, sample, row, key: str, turns: list[str], tool_texts: list[str]):
    """Every turn but the last calls a tool, the last answers."""
    s = await rollout(stack, tok, args, sample, row, key, turns, [tool_delta(tok, text) for text in tool_texts])
    names = list(row["extra_info"]["tools_kwargs"])
    md = s.metadata
    assert md["turns"] == len(turns) and md["tool_errors"] == [] and md["parse_errors"] == []
    assert md["template_drift"] is False and md["tool_calls"] == {names[0]: len(tool_texts)}
    return s


def user_delta(tok, content: str) -> list[int]:
    """What Qwen3's template inserts for a user turn after an assistant turn that ended with <|im_end|>."""
    return tok.encode(f"\n<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
