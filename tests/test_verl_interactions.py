"""verl's interaction configs at the boundary: the YAML loader (every mistake named by file, entry
and field; any YAML data an InteractionSet or such an error, hypothesis-generated), the adapter
that holds any BaseInteraction-shaped class to verl's contract, the row's interaction_kwargs, the
flags and the start-up checks. The multi-turn rollouts with interactions: tests/test_verl_yamls.py."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from slime.rollout.flags import PromptConfig
from slime.interactions.adapter import InteractionAdapter, InteractionError, UserReply
from slime.interactions.gsm8k_interaction import CORRECT, INCORRECT, Gsm8kInteraction, strict_gsm8k_score
from slime.interactions.verl_gsm8k_interaction import Gsm8kInteraction as VerlGsm8kInteraction
from slime.interactions.registry import InteractionConfigError, default_name, interaction_names, load_interaction_config

SCRIPTED = "slime.testing.interactions.ScriptedUser"
GSM8K = "verl.interactions.gsm8k_interaction.Gsm8kInteraction"


def write(tmp_path, data, name="interaction.yaml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


REFUSED = [  # (file content, what follows "<file>: " in the error)
    ("- 1\n", "expected a top-level 'interaction:' list"),
    ("interaction: {name: x}\n", "expected a top-level 'interaction:' list"),
    ("interaction: []\n", "interaction: the list is empty; nothing would answer the model"),
    (
        "tools: []\n",
        "tools: this is a verl tool config; give it to --tool-config-path (--interaction-config-path "
        "takes a top-level 'interaction:' list)",
    ),
    ("interaction: [{class_name: a.B}]\nextra: 1\n", "unknown top-level field(s) ['extra']"),
    ("interaction: [3]\n", "interaction[0]: expected a mapping with name, class_name, config"),
    ("interaction: [{name: a}]\n", "interaction[0].class_name: required, a dotted path like 'pkg.module.Class'"),
    (
        "interaction: [{class_name: a.B, kwargs: {}}]\n",
        "interaction[0]: unknown field(s) ['kwargs'] (an entry has ['name', 'class_name', 'config'])",
    ),
    ("interaction: [{class_name: a.B, name: 3}]\n", "interaction[0].name: must be a non-empty string, got 3"),
    (
        f"interaction: [{{class_name: {SCRIPTED}}}, {{name: scripteduser, class_name: {SCRIPTED}}}]\n",
        "interaction[1].name: duplicate interaction name 'scripteduser' (already used by interaction[0])",
    ),
    (
        f"interaction: [{{class_name: {SCRIPTED}, name: s, config: [1]}}]\n",
        "interaction[0].config: expected a mapping, got list",
    ),
    (
        f"interaction: [{{class_name: {SCRIPTED}, name: s, config: {{replies: 3}}}}]\n",
        f"interaction[0]: {SCRIPTED}(config=...) failed: TypeError: 'int' object is not iterable",
    ),
    (
        "interaction: [{class_name: slime.tools.gsm8k_tool.Gsm8kTool, name: s}]\n",
        "interaction[0].class_name: 'slime.tools.gsm8k_tool.Gsm8kTool' is not an interaction class (one with "
        "start_interaction, generate_response, finalize_interaction, as verl's BaseInteraction)",
    ),
    (
        "interaction: [{class_name: verl.interactions.weather_interaction.WeatherInteraction}]\n",
        "interaction[0].class_name: 'verl.interactions.weather_interaction.WeatherInteraction': verl is not installed "
        "and slime has no equivalent of this class (slime has: ['verl.interactions.base.BaseInteraction', "
        "'verl.interactions.gsm8k_interaction.Gsm8kInteraction']); install verl, or point class_name at your own "
        "interaction class",
    ),
]


@pytest.mark.parametrize("content, expected", REFUSED)
def test_a_bad_interaction_config_is_refused_naming_file_entry_and_field(tmp_path, content, expected):
    path = write(tmp_path, content)
    with pytest.raises(InteractionConfigError) as e:
        load_interaction_config(path)
    assert str(e.value) == f"{path}: {expected}"


def test_a_class_that_does_not_import_is_named_with_its_entry(tmp_path):
    path = write(tmp_path, "interaction: [{name: j, class_name: no_such_module.Judge}]\n")
    with pytest.raises(InteractionConfigError) as e:
        load_interaction_config(path)
    assert str(e.value).startswith(f"{path}: interaction[0].class_name: ") and "no_such_module" in str(e.value)


def test_a_yaml_syntax_error_names_its_line(tmp_path):
    path = write(tmp_path, "interaction:\n  - class_name: x\n    config: [a, b\n")
    with pytest.raises(InteractionConfigError) as e:
        load_interaction_config(path)
    assert str(e.value).startswith(f"{path}: invalid YAML at line ")


def test_names_follow_verl_given_or_from_the_class_and_reach_the_config(tmp_path):
    assert [default_name(c) for c in (GSM8K, "my.pkg.Judge", "my.pkg.Interaction")] == ["gsm8k", "judge", ""]
    unnamed = write(tmp_path, "interaction: [{class_name: my.pkg.Interaction}]\n", "unnamed.yaml")
    with pytest.raises(InteractionConfigError) as e:
        interaction_names(unnamed)
    assert str(e.value) == (
        f"{unnamed}: interaction[0].name: required (verl's name from the class name "
        f"'my.pkg.Interaction' would be empty)"
    )
    path = write(
        tmp_path,
        {
            "interaction": [
                {"class_name": GSM8K, "config": None},
                {"name": "second", "class_name": SCRIPTED, "config": {"replies": []}},
            ]
        },
    )
    loaded = load_interaction_config(path)
    assert loaded.names == interaction_names(path) == ["gsm8k", "second"]
    assert isinstance(loaded.by_name["gsm8k"].inner, VerlGsm8kInteraction)  # verl's name: verl's behaviour
    assert loaded.by_name["second"].inner.config == {"replies": [], "name": "second"}


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (None, "interaction_kwargs must be a mapping with a 'name', got NoneType"),
        ({"query": "q"}, "interaction_kwargs has no 'name' string (verl requires one; {path} configures ['gsm8k'])"),
        (
            {"name": "judge"},
            "interaction_kwargs names interaction 'judge', which {path} does not configure (it has ['gsm8k'])",
        ),
    ],
)
def test_a_sample_picks_its_interaction_by_name_or_is_told_why_not(tmp_path, kwargs, expected):
    path = write(tmp_path, {"interaction": [{"class_name": GSM8K}]})
    loaded = load_interaction_config(path)
    assert loaded.select({"name": "gsm8k"}) is loaded.by_name["gsm8k"]
    with pytest.raises(ValueError) as e:
        loaded.select(kwargs)
    assert str(e.value) == expected.format(path=path)


# ------------------------------------------------------------------ any YAML data, hypothesis-generated

yaml_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
yaml_data = st.recursive(
    yaml_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["interaction", "tools", "name", "class_name", "config", "replies", "x"]), inner, max_size=3
        )
    ),
    max_leaves=10,
)
GOOD_ENTRY = {"name": "judge", "class_name": SCRIPTED, "config": {"replies": [[True, "ok", 1.0]]}}
class_names = st.sampled_from(
    [
        "",
        ".",
        "a.",
        ".b",
        "a..b",
        "0",
        "x y",
        "os.path",
        "builtins.dict",
        "verl",
        "verl.interactions.x.Y",
        SCRIPTED,
        GSM8K,
    ]
) | st.text(max_size=6)
entries = st.fixed_dictionaries({"class_name": class_names}, optional={"name": yaml_data, "config": yaml_data})


@settings(max_examples=60, deadline=None)
@given(
    data=st.one_of(
        yaml_data,
        st.builds(lambda e: {"interaction": [e]}, yaml_data),
        st.builds(lambda es: {"interaction": es}, st.lists(entries, max_size=3)),
        st.builds(
            lambda k, v: {"interaction": [{**GOOD_ENTRY, k: v}]},
            st.sampled_from(["name", "class_name", "config", "x"]),
            yaml_data,
        ),
    )
)
@example(data={"interaction": [GOOD_ENTRY]})
def test_any_yaml_data_is_an_interaction_set_or_an_error_naming_the_file(tmp_path_factory, data):
    path = write(tmp_path_factory.mktemp("yaml"), data)
    try:
        loaded = load_interaction_config(path)
    except InteractionConfigError as e:
        assert str(e).startswith(f"{path}: "), str(e)
        return
    assert loaded.names and all(isinstance(n, str) and n for n in loaded.names)
    assert loaded.names == interaction_names(path)


@settings(max_examples=25, deadline=None)
@given(raw=st.one_of(st.binary(max_size=60), st.text(max_size=60).map(str.encode)))
@example(raw=b"interaction:\n  - class_name: \xff\n")  # (deep nesting: the same reader, tests/test_boundary_tools.py)
def test_bytes_that_are_not_an_interaction_config_are_refused_naming_the_file(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("yaml") / "interaction.yaml"
    path.write_bytes(raw)
    with pytest.raises(InteractionConfigError) as e:
        load_interaction_config(path)
    assert str(e.value).startswith(f"{path}: ")


# ------------------------------------------------------------------ verl's contract, held by the adapter


class SyncJudge:
    """verl's BaseInteraction shape with sync methods and verl's base `finalize_interaction(self)`."""

    def __init__(self, answer):
        self.answer, self.finalized = answer, 0

    def start_interaction(self, instance_id=None, **kwargs):
        return instance_id

    def generate_response(self, instance_id, messages, **kwargs):
        return self.answer

    def finalize_interaction(self):
        self.finalized += 1


def judge(answer) -> InteractionAdapter:
    return InteractionAdapter(SyncJudge(answer), "j", "tests.SyncJudge")


def test_sync_methods_and_an_argument_free_finalize_are_called_as_verl_defines_them():
    np = pytest.importorskip("numpy")
    adapter = judge(
        (np.float64(0.5) > 0.1, "fine", np.float64(0.5), {"n": np.int64(2), "v": np.zeros(2), "t": Path("x")})
    )

    async def go():
        await adapter.start("i", {"name": "j"})
        reply = await adapter.respond("i", [], {"name": "j"})
        await adapter.finalize("i")
        return reply

    reply = asyncio.run(go())
    assert reply == UserReply(True, "fine", 0.5, {"n": 2, "v": [0.0, 0.0], "t": "x"}) and adapter.inner.finalized == 1
    assert type(reply.metrics["n"]) is int  # builtins: the sample's metadata loads with weights_only


@pytest.mark.parametrize(
    "answer, problem",
    [
        (
            (True, "x", 1.0),
            "returned tuple (True, 'x', 1.0); expected (should_terminate_sequence, response_content, score, metrics)",
        ),
        ("done", "returned str 'done'; expected (should_terminate_sequence, response_content, score, metrics)"),
        ((1, "x", 1.0, {}), ": should_terminate_sequence must be a bool, got int"),
        ((False, None, 1.0, {}), ": response_content must be a str, got NoneType"),
        ((False, "x", float("nan"), {}), ": the score must be a finite number or None, got nan"),
        ((False, "x", "1", {}), ": the score must be a finite number or None, got '1'"),
        ((False, "x", 1.0, [1]), ": metrics must be a dict or None, got list"),
    ],
)
def test_a_reply_outside_verls_contract_is_an_error_naming_the_interaction(answer, problem):
    with pytest.raises(InteractionError) as e:
        asyncio.run(judge(answer).respond("i", [], {}))
    sep = "" if problem.startswith(":") else " "
    assert str(e.value) == f"interaction 'j' (tests.SyncJudge).generate_response(){sep}{problem}"


def test_gsm8k_interaction_scores_the_last_answer_with_verls_strict_rule():
    assert [
        strict_gsm8k_score(t, "72")
        for t in ("#### 72", "#### 7,2", "#### $72", "72", "#### 72.0", "#### 70 then #### 72", "#### 72" + " " * 300)
    ] == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    inter = Gsm8kInteraction({"name": "gsm8k"})

    async def go():
        iid = await inter.start_interaction("a", ground_truth="72", query="q", name="gsm8k")
        wrong = await inter.generate_response(
            iid, [{"role": "assistant", "content": "#### 70"}, {"role": "user", "content": "#### 72"}]
        )
        right = await inter.generate_response(iid, [{"role": "assistant", "content": "so #### 72"}])
        await inter.finalize_interaction(iid)
        return wrong, right

    assert asyncio.run(go()) == ((False, INCORRECT, 0.0, {}), (True, CORRECT, 1.0, {}))
    assert inter._instance_dict == {}


# ------------------------------------------------------------------ rows, flags, start-up checks


def row_args(**kw):
    from slime.cli.finalize import complete_namespace

    return complete_namespace(
        argparse.Namespace(
            **{
                "metadata_key": None,
                "tool_key": None,
                "interaction_config_path": "i.yaml",
                "interaction_key": "extra_info.interaction_kwargs",
                **kw,
            }
        )
    )


@pytest.mark.parametrize(
    "extra_info, problem",
    [
        (
            {},
            "missing interaction key 'extra_info.interaction_kwargs' (no field 'interaction_kwargs'); set "
            "--interaction-key",
        ),
        (
            {"interaction_kwargs": "gsm8k"},
            "--interaction-key 'extra_info.interaction_kwargs': expected verl's interaction_kwargs mapping, got str",
        ),
        (
            {"interaction_kwargs": {"query": "q"}},
            "--interaction-key 'extra_info.interaction_kwargs': no 'name' string "
            "(it picks the interaction of --interaction-config-path; verl requires it)",
        ),
    ],
)
def test_a_row_without_verls_interaction_kwargs_is_refused_naming_the_row(extra_info, problem):
    from slime.rollout.data_source import DataError, sample_from_row

    row = {"prompt": [{"role": "user", "content": "q"}], "extra_info": extra_info}
    with pytest.raises(DataError) as e:
        sample_from_row(PromptConfig.from_args(row_args()), row, "data.jsonl:3", "prompt", None)
    assert str(e.value) == f"data.jsonl:3: {problem}"
    ok = {**row, "extra_info": {"interaction_kwargs": {"name": "gsm8k", "ground_truth": "72"}}}
    assert sample_from_row(PromptConfig.from_args(row_args()), ok, "w", "prompt", None).metadata == {
        "messages": row["prompt"],
        "interaction_kwargs": {"name": "gsm8k", "ground_truth": "72"},
    }
    assert (
        "interaction_kwargs"
        not in sample_from_row(
            PromptConfig.from_args(row_args(interaction_config_path=None)), ok, "w", "prompt", None
        ).metadata
    )


def test_the_flags_parse_with_verls_meaning_and_defaults():
    from slime.cli.args import parse_args

    from slime.tools.flags import tool_defaults

    args = parse_args(["--interaction-config-path", "i.yaml", "--max-user-turns", "5"])
    assert (args.interaction_config_path, args.max_user_turns, args.interaction_key) == (
        "i.yaml",
        5,
        "extra_info.interaction_kwargs",
    )
    defaults = tool_defaults()
    assert (defaults["interaction_config_path"], defaults["max_user_turns"]) == (None, None)


MULTI_TURN = "rollout_plugins.multi_turn.generate_rollout"
DEFAULT = "slime.rollout.sglang_rollout.generate_rollout"
INTERACTION = str(
    Path(__file__).parent
    / "data"
    / "verl"
    / "examples"
    / "sglang_multiturn"
    / "config"
    / "interaction_config"
    / "gsm8k_interaction_config.yaml"
)


@pytest.mark.parametrize(
    "flags, expected",
    [
        (
            {"interaction_config_path": "{bad}"},
            "--interaction-config-path: {bad}: interaction: the list is empty; nothing would answer the model",
        ),
        (
            {"rollout_function_path": DEFAULT},
            "--interaction-config-path: the default generate has no multi-turn loop and would never ask the interaction; "
            "set --rollout-function-path rollout_plugins.multi_turn.generate_rollout (or --custom-generate-function-path "
            "rollout_plugins.multi_turn.generate)",
        ),
        ({"max_user_turns": 0}, "--max-user-turns: must be at least 1, got 0 (leave it unset for no limit)"),
        ({}, None),
    ],
)
def test_the_start_up_checks_refuse_what_would_not_run(tmp_path, flags, expected):
    from slime.cli.finalize import complete_namespace
    from slime.cli.preflight import PreflightError, check_interactions

    bad = write(tmp_path, "interaction: []\n")
    args = complete_namespace(
        argparse.Namespace(
            **{
                "interaction_config_path": INTERACTION,
                "rollout_function_path": MULTI_TURN,
                "custom_generate_function_path": None,
                "max_user_turns": None,
                **flags,
            }
        )
    )
    args.interaction_config_path = args.interaction_config_path.format(bad=bad)
    if expected is None:
        check_interactions(args)
        return
    with pytest.raises(PreflightError) as e:
        check_interactions(args)
    assert str(e.value) == expected.format(bad=bad)
