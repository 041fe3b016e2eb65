"""The embedded engine's OpenAI-compatible `/v1/completions` and `/v1/chat/completions` (SGLang serves
both; slime's rollout-buffer generator and agent frameworks call them), through the `openai` client
against the real engine: the same tokens as `/generate` for the same prompt (greedy), usage counted
from the engine's own token counts, the chat prompt rendered by the model's chat template."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import requests
from transformers import AutoTokenizer

from tests.hf_engine_fixtures import run_engine


@pytest.fixture(scope="module")
def engine(tiny_model_dir, engine_fork_server):
    with run_engine(tiny_model_dir, fork_server=engine_fork_server) as url:
        yield url


def _generate(url: str, body: dict) -> dict:
    return requests.post(f"{url}/generate", json=body, timeout=120).json()


def test_completions_are_generate_with_openai_shapes(engine, tiny_model_dir):
    from openai import OpenAI

    client = OpenAI(base_url=f"{engine}/v1", api_key="none", max_retries=0, timeout=120)
    out = client.completions.create(model="m", prompt="Count: one two", max_tokens=6, temperature=0, logprobs=1)
    ref = _generate(
        engine,
        {"text": "Count: one two", "return_logprob": True, "sampling_params": {"max_new_tokens": 6, "temperature": 0}},
    )
    choice = out.choices[0]
    assert choice.text == ref["text"] and choice.finish_reason == ref["meta_info"]["finish_reason"]["type"]
    assert out.usage.prompt_tokens == ref["meta_info"]["prompt_tokens"]
    assert out.usage.completion_tokens == ref["meta_info"]["completion_tokens"] == len(choice.logprobs.token_logprobs)
    assert choice.logprobs.token_logprobs == pytest.approx([p[0] for p in ref["meta_info"]["output_token_logprobs"]])
    assert out.object == "text_completion" and out.model == "m"


def test_chat_completions_render_the_chat_template(engine, tiny_model_dir):
    from openai import OpenAI

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "user", "content": "Say hi."}]
    client = OpenAI(base_url=f"{engine}/v1", api_key="none", max_retries=0, timeout=120)
    out = client.chat.completions.create(model="m", messages=messages, max_tokens=5, temperature=0)
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ref = _generate(engine, {"input_ids": ids, "sampling_params": {"max_new_tokens": 5, "temperature": 0}})
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content == ref["text"]
    assert out.usage.prompt_tokens == len(ids) and out.object == "chat.completion"


@pytest.mark.parametrize(
    "path,body,message",
    [
        ("/v1/chat/completions", {"messages": []}, "messages: a non-empty list is required"),
        ("/v1/completions", {"prompt": {"x": 1}}, "prompt: a string or a list of token ids is required"),
        ("/v1/completions", {"prompt": "a", "n": 2}, "n: only one choice per request"),
        ("/v1/completions", {"prompt": "a", "stream": True}, "stream is not supported"),
    ],
)
def test_bad_requests_say_what_is_wrong(engine, path, body, message):
    r = requests.post(f"{engine}{path}", json=body, timeout=60)
    assert r.status_code == 400 and message in r.json()["error"]["message"]


def test_models_lists_the_served_model(engine, tiny_model_dir):
    r = requests.get(f"{engine}/v1/models", timeout=60).json()
    assert r["data"][0]["id"] == str(tiny_model_dir)


def test_slimes_rollout_buffer_generator_queries_the_engine_unchanged(engine):
    """slime's rollout-buffer generator (`slime_plugins/rollout_buffer/generator/base_generator.py`
    at 624b824a, unchanged): its chat query and its reward, through the OpenAI client, against this engine."""
    from openai import OpenAI

    path = Path(__file__).parent / "upstream_slime/slime_plugins/rollout_buffer/generator/base_generator.py"
    spec = importlib.util.spec_from_file_location("slime_rollout_buffer_base_generator", path)
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    client = OpenAI(api_key="test", base_url=f"{engine}/v1", max_retries=0, timeout=120)
    messages, finish = generator.query_single_turn(
        client, [{"role": "user", "content": "1+1?"}], {"max_tokens": 4, "temperature": 0.7, "top_p": 1}
    )
    assert messages[-1]["role"] == "assistant" and isinstance(messages[-1]["content"], str)
    assert finish in ("stop", "length")
    assert generator.get_rule_based_math_reward({"messages": messages, "label": "2"}) in (0, 1, 0.0, 1.0)
