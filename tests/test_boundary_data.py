"""Data file rows, hypothesis-generated (messages, label, metadata, tools; JSONL), with
and without --apply-chat-template: each row is either refused by preflight's check naming the
file and line, or processed by the manager's path -- the data source serves it and the default
generate gets its prompt ids -- without an exception."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from slime.rollout.data_source import DataError, DataSource
from slime.rollout.prompt_index import PromptIndex
from slime.rollout.sglang_rollout import prompt_ids

GOOD = {"messages": [{"role": "user", "content": "Hi"}], "label": "1"}


@pytest.fixture(scope="module")
def tok():
    from slime.testing.tiny_model import qwen_tokenizer_dir
    from slime.utils.processing_utils import load_tokenizer

    return load_tokenizer(str(qwen_tokenizer_dir()))


def _args(path, templated: bool) -> SimpleNamespace:
    """The flags these tests set; every other one at the parser's default, as the data source completes it."""
    from slime.utils.plugin_args import completed

    return completed(
        SimpleNamespace(
            apply_chat_template=templated,
            apply_chat_template_kwargs={},
            rollout_max_prompt_len=None,
            rollout_max_context_len=None,
            metadata_key="metadata",
            tool_key="tools",
            over_long_prompt="filter",
            rollout_seed=42,
            buffer_filter_path=None,
            prompt_data=str(path),
            input_key="messages",
            label_key="label",
            n_samples_per_prompt=2,
            rollout_shuffle=False,
            custom_generate_function_path=None,
            rollout_function_path="slime.rollout.sglang_rollout.generate_rollout",
        )
    )


text = st.one_of(st.text(max_size=8), st.text(max_size=4).map(lambda s: s + "\ud800"))  # (a lone surrogate)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=6,
)
part = st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": text}), json_value)
message = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "narrator"]), json_value)},
    optional={
        "content": st.one_of(text, st.none(), st.integers(), st.lists(part, max_size=3), json_value),
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "type": st.just("function"),
                    "function": st.fixed_dictionaries(
                        {"name": text, "arguments": st.one_of(text, st.dictionaries(text, json_value, max_size=2))}
                    ),
                }
            ),
            max_size=2,
        ),
        "reasoning_content": text,
    },
)
row = st.fixed_dictionaries(
    {"messages": st.one_of(st.lists(message, max_size=4), json_value)},
    optional={
        "label": json_value,
        "metadata": json_value,
        "tools": st.one_of(
            json_value,
            st.lists(
                st.fixed_dictionaries(
                    {
                        "type": st.just("function"),
                        "function": st.fixed_dictionaries(
                            {"name": text}, optional={"parameters": json_value, "description": text}
                        ),
                    }
                ),
                max_size=2,
            ),
        ),
    },
)


def refused_or_served(tmp_path, tok, bad: dict, templated: bool) -> str:
    """'refused' (naming file and line 2) or 'served' (every prompt's ids reach the generate call)."""
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (GOOD, bad, GOOD)) + "\n")  # surrogates as \\ud800 escapes
    args = _args(path, templated)
    index = PromptIndex.from_args(args, path, "messages", "label", tok if templated else None)
    try:
        index.check_all()
    except DataError as e:
        assert str(e).startswith(f"{path}:2: "), str(e)
        return "refused"
    finally:
        index.close()
    source = DataSource.from_args(args, tok if templated else None)
    runtime = SimpleNamespace(tokenizer=tok)
    for group in source.get_samples(3):
        for sample in group:
            ids = prompt_ids(args, sample, runtime)
            assert ids and all(isinstance(i, int) for i in ids)
    return "served"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=row, templated=st.booleans())
@example(bad={"messages": []}, templated=False)
@example(bad={"messages": [{"role": "user", "content": [1, 2]}]}, templated=False)
@example(bad={"messages": [{"role": "user", "content": "x", "name": "a\ud800"}]}, templated=False)
@example(bad={"messages": 7}, templated=False)
def test_a_row_is_refused_naming_its_line_or_served(tmp_path_factory, tok, bad, templated):
    refused_or_served(tmp_path_factory.mktemp("rows"), tok, bad, templated)


@pytest.mark.parametrize(
    "bad,templated,message",
    [
        ({"messages": []}, False, "key 'messages' is an empty message list (the chat template has nothing to render)"),
        (
            {"messages": [{"role": "user", "content": [1]}]},
            False,
            "messages[0]['content'][0] must be a content part (an object), got int 1",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "name": "a\ud800"}]},
            True,
            "messages[0]['name'] holds a lone surrogate ('\\ud800' at character 1), not text; fix the row",
        ),
        ({"messages": ""}, False, "key 'messages' is an empty string (no prompt to generate from)"),
        (
            {"messages": 7},
            False,
            "key 'messages' is int; the default generate reads text or a message list "
            "(set --custom-generate-function-path to read other prompts)",
        ),
    ],
)
def test_rows_the_default_generate_cannot_read_are_refused_without_a_template_too(
    tmp_path, tok, bad, templated, message
):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (GOOD, {**bad, "label": "1"})) + "\n")
    index = PromptIndex.from_args(_args(path, templated), path, "messages", "label", tok if templated else None)
    with pytest.raises(DataError) as e:
        index.check_all()
    assert str(e.value) == f"{path}:2: {message}"


def test_a_custom_generate_still_gets_any_prompt(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"messages": {"index": 3}, "label": 1}) + "\n")
    args = dict(vars(_args(path, False)), custom_generate_function_path="my.generate")
    [sample] = PromptIndex.from_args(SimpleNamespace(**args), path, "messages", "label")
    assert (sample.prompt, sample.label) == ({"index": 3}, 1)
