"""verl's own tool and interaction configs (vendored unchanged under tests/data/verl/, see its README):
each one loads, runs a multi-turn rollout with verl's data recipe row, or is refused before anything
starts with an error naming the file, the entry, the tool and the field. (The interaction loader's
own errors and boundaries: tests/test_verl_interactions.py.)

| file (verl path)                                          | outcome                                   |
| --------------------------------------------------------- | ----------------------------------------- |
| tool_config/gsm8k_tool_config.yaml                        | loads, runs unchanged                     |
| tool_config/sandbox_fusion_tool_config.yaml, tests' copy  | loads; refused at start (sandbox URL)     |
| tool_config/search_tool_config.yaml, tests' copy          | loads; refused at start (retriever URL)   |
| sandbox / search with only their URL pointed at ours      | runs                                      |
| tool_config/geo3k_tool_config.yaml                        | loads, runs unchanged (verl's grading: VerlGeo3kTool) |
| tool_config/mcp_tool_config.yaml, tests' copy             | refused at load (no MCP client)           |
| interaction_config/gsm8k_interaction_config.yaml          | loads (--interaction-config-path), runs   |
|   the same file given to --tool-config-path               | refused at load, pointing to the flag     |
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from slime.tools.reachability import check_services
from slime.tools.registry import ToolConfigError, load_tool_config
from slime.tools.sandbox_fusion_tool import SandboxFusionTool
from slime.tools.search_tool import SearchTool
from slime.tools.verl_answer_tools import VerlGeo3kTool, VerlGsm8kTool
from slime.tools.verl_compat import verl_installed
from tests.verl_rollouts import (  # noqa: F401 - tok, stack: the module's fixtures
    PARAMS,
    call,
    recipe_sample,
    rollout,
    run_turns,
    say,
    stack,
    tok,
    user_delta,
)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "verl"
EX = "examples/sglang_multiturn/config/tool_config"
TESTS = "tests/workers/rollout/resource/tool_configs"
INTERACTION = "examples/sglang_multiturn/config/interaction_config/gsm8k_interaction_config.yaml"
without_verl = pytest.mark.skipif(verl_installed(), reason="checks the mapping used when verl is not installed")

LOADS = {  # file -> (tool names, slime class)
    f"{EX}/gsm8k_tool_config.yaml": (["calc_gsm8k_reward"], VerlGsm8kTool),
    f"{EX}/geo3k_tool_config.yaml": (["calc_geo3k_reward"], VerlGeo3kTool),
    f"{EX}/sandbox_fusion_tool_config.yaml": (["code_interpreter"], SandboxFusionTool),
    f"{EX}/search_tool_config.yaml": (["search"], SearchTool),
    f"{TESTS}/sandbox_fusion_tool_config": (["code_interpreter"], SandboxFusionTool),
    f"{TESTS}/search_tool_config": (["search"], SearchTool),
}
SANDBOX_URL = "https://xxx.apigateway-cn-beijing.volceapi.com/run_code"
REFUSED_AT_START = {  # file -> what follows "<file>: " in the refusal
    # the placeholder gateway does not resolve (the reason is the resolver's, so it is not pinned)
    f"{EX}/sandbox_fusion_tool_config.yaml": f"tools[0] ('code_interpreter').config.sandbox_fusion_url: cannot "
    f"reach {SANDBOX_URL} (",
    f"{TESTS}/sandbox_fusion_tool_config": f"tools[0] ('code_interpreter').config.sandbox_fusion_url: cannot reach "
    f"{SANDBOX_URL} (",
    f"{EX}/search_tool_config.yaml": "tools[0] ('search').config.retrieval_service_url: cannot reach "
    "http://127.0.0.1:8000/retrieve (ConnectionRefusedError: ",
    f"{TESTS}/search_tool_config": "tools[0] ('search').config.retrieval_service_url: cannot reach "
    "http://127.0.0.1:8000/retrieve (ConnectionRefusedError: ",
}
NO_MCP_CLIENT = (
    "tools[0] (verl.tools.mcp_search_tool.MCPSearchTool, config.type: mcp): cannot create the MCP tools "
    "['tavily_search_tool'] of {servers}: the MCP client library is not installed (pip install mcp)"
)
REFUSED_AT_LOAD = {  # file -> the whole refusal after "<file>: " ({dir}: the file's folder)
    f"{EX}/mcp_tool_config.yaml": NO_MCP_CLIENT.format(servers="{dir}/mcp_server.json"),
    # relative to the folder verl runs that test from (tests/workers/rollout); see the chdir test
    f"{TESTS}/mcp_tool_config": (
        "tools[0].mcp.mcp_servers_config_path: no such file "
        "'./resource/tool_configs/mcp_server.json' (looked in {cwd}/resource/tool_configs, "
        "{dir}/resource/tool_configs)"
    ),
}
INTERACTIONS = {INTERACTION: (["gsm8k"], "slime.interactions.verl_gsm8k_interaction.Gsm8kInteraction")}
SERVER_LISTS = {f"{EX}/mcp_server.json", f"{TESTS}/mcp_server.json"}  # read by the two mcp configs


def test_every_vendored_file_has_an_expected_outcome():
    files = {str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file()}
    configs = files - {"README.md"} - {f for f in files if f.startswith("rows/")} - SERVER_LISTS
    assert configs == set(LOADS) | set(REFUSED_AT_LOAD) | set(INTERACTIONS)
    assert set(REFUSED_AT_START) <= set(LOADS) and SERVER_LISTS <= files


@without_verl
@pytest.mark.parametrize("name", sorted(LOADS))
def test_verl_config_loads_unchanged(name):
    names, cls = LOADS[name]
    tools = load_tool_config(DATA / name)
    assert tools.names == names and [type(t) for t in tools.tools.values()] == [cls]
    raw = yaml.safe_load((DATA / name).read_text())["tools"][0]
    assert tools.schemas() == [raw["tool_schema"]]  # the prompt shows verl's schema as written
    assert dict(tools[names[0]].config) == raw["config"]


@pytest.mark.parametrize("given", [{}, {"strict": True}, {"strict": False}])
def test_strict_reaches_the_prompt_only_when_the_config_sets_it(given):
    """verl shows its schemas with `exclude_unset`: a YAML without `strict` shows none."""
    from slime.tools.schemas import OpenAIFunctionToolSchema

    raw = {"type": "function", "function": {"name": "f", "description": "d", **given}}
    shown = OpenAIFunctionToolSchema.model_validate(raw).to_openai()["function"]
    empty = {"type": "object", "properties": {}, "required": []}
    assert shown == {"name": "f", "description": "d", "parameters": empty, **given}


@without_verl
@pytest.mark.parametrize("name", sorted(INTERACTIONS))
def test_verl_interaction_config_loads_unchanged(name):
    from slime.interactions.registry import load_interaction_config

    names, cls = INTERACTIONS[name]
    loaded = load_interaction_config(DATA / name)
    assert loaded.names == names
    inner = loaded.by_name[names[0]].inner
    assert f"{type(inner).__module__}.{type(inner).__qualname__}" == cls
    assert inner.config == {"name": names[0]} and inner.name == names[0]  # verl puts the name into config


def test_an_interaction_config_given_as_tool_config_points_to_its_flag(tmp_path):
    path = DATA / INTERACTION
    with pytest.raises(ToolConfigError) as e:
        load_tool_config(path)
    assert str(e.value) == (
        f"{path}: interaction: this is a verl interaction config ('gsm8k' "
        f"(verl.interactions.gsm8k_interaction.Gsm8kInteraction)), not a tool config: give it to "
        f"--interaction-config-path (--tool-config-path takes a top-level 'tools:' list)"
    )
    unnamed = tmp_path / "interaction.yaml"
    unnamed.write_text("interaction:\n  - class_name: my.interactions.Judge\n    config: {}\n")
    with pytest.raises(
        ToolConfigError,
        match=r"interaction: this is a verl interaction config \(my\.interactions"
        r"\.Judge\), not a tool config: give it to --interaction-config-path",
    ):
        load_tool_config(unnamed)


@without_verl
@pytest.mark.parametrize("name", sorted(REFUSED_AT_LOAD))
def test_verl_config_refused_at_load_names_file_and_field(name, monkeypatch):
    from slime.tools import mcp_tool

    monkeypatch.setattr(mcp_tool, "mcp_client_available", lambda: False)
    path = DATA / name
    with pytest.raises(ToolConfigError) as e:
        load_tool_config(path)
    expected = REFUSED_AT_LOAD[name].format(cwd=Path.cwd(), dir=path.parent.resolve())
    assert str(e.value) == f"{path}: {expected}"


@without_verl
def test_verl_tests_mcp_config_from_verls_folder_reaches_the_mcp_refusal(monkeypatch):
    """Run from the folder verl's test runs in, the relative server list is found (verl's rule: the CWD)."""
    from slime.tools import mcp_tool

    monkeypatch.setattr(mcp_tool, "mcp_client_available", lambda: False)
    monkeypatch.chdir(DATA / "tests" / "workers" / "rollout")
    path = DATA / TESTS / "mcp_tool_config"
    with pytest.raises(ToolConfigError) as e:
        load_tool_config(path)
    assert str(e.value) == f"{path}: " + NO_MCP_CLIENT.format(servers="resource/tool_configs/mcp_server.json")


@pytest.mark.parametrize("name", sorted(REFUSED_AT_START))
def test_verl_config_with_an_unreachable_service_is_refused_before_the_run(name):
    """The preflight of `--tool-config-path` (what the CLI runs before Ray starts) names the service."""
    from slime.cli.preflight import PreflightError, check_tools

    if "127.0.0.1:8000" in REFUSED_AT_START[name] and _listening("127.0.0.1", 8000):
        pytest.skip("something else listens on 127.0.0.1:8000, verl's retriever address")
    path = DATA / name
    with pytest.raises(PreflightError) as e:
        check_tools(argparse.Namespace(tool_config_path=str(path)))
    msg = str(e.value)
    assert msg.startswith(f"--tool-config-path: {path}: {REFUSED_AT_START[name]}"), msg
    assert msg.endswith("); start the service there or change the URL before the run starts"), msg


@without_verl
def test_slime_rollout_with_verls_sandbox_yaml_stops_before_anything_starts(tmp_path, tiny_model_dir, capsys):
    """The whole command line: verl's DAPO row and sandbox YAML, unchanged; the run body never starts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from slime.cli.args import parse_args
    from slime.cli.command import run_cli

    rows = [json.loads((DATA / "rows" / "dapo_multiturn_w_tool.jsonl").read_text())]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    config = DATA / EX / "sandbox_fusion_tool_config.yaml"
    started = []
    rc = run_cli(
        "slime-rollout",
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(tmp_path / "train.parquet"),
            "--input-key",
            "prompt",
            "--label-key",
            "reward_model.ground_truth",
            "--tool-key",
            "extra_info.tools_kwargs",
            "--tool-config-path",
            str(config),
            "--rollout-function-path",
            "rollout_plugins.multi_turn.generate_rollout",
        ],
        parse_args,
        started.append,
    )
    err = capsys.readouterr().err
    assert rc == 1 and started == []
    refusal = REFUSED_AT_START[f"{EX}/sandbox_fusion_tool_config.yaml"]
    assert f"slime-rollout: error: --tool-config-path: {config}: {refusal}" in err, err


@without_verl
def test_slime_rollout_takes_verls_interaction_yaml_and_row_and_refuses_the_default_generate(
    tmp_path, tiny_model_dir, capsys
):
    """The whole command line with verl's interaction recipe: its row and YAML pass every start-up check with
    the multi-turn loop; with the default generate (which would never ask the interaction) nothing starts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from slime.cli.args import parse_args
    from slime.cli.command import run_cli

    rows = [json.loads((DATA / "rows" / "gsm8k_multiturn_w_interaction.jsonl").read_text())]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    argv = [
        "--rollout-backend",
        "hf",
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--prompt-data",
        str(tmp_path / "train.parquet"),
        "--input-key",
        "prompt",
        "--label-key",
        "reward_model.ground_truth",
        "--interaction-config-path",
        str(DATA / INTERACTION),
        "--max-user-turns",
        "5",
    ]
    started: list[Any] = []
    assert run_cli("slime-rollout", argv, parse_args, started.append) == 1 and started == []
    assert (
        "slime-rollout: error: --interaction-config-path: the default generate has no multi-turn loop"
        in capsys.readouterr().err
    )
    multi_turn = ["--rollout-function-path", "rollout_plugins.multi_turn.generate_rollout"]
    assert run_cli("slime-rollout", argv + multi_turn, parse_args, started.append) == 0
    (args,) = started
    assert (args.interaction_config_path, args.max_user_turns) == (str(DATA / INTERACTION), 5)


def _listening(host: str, port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def test_reachable_services_pass_and_every_unreachable_one_is_counted(tmp_path):
    from slime.testing.retriever import Retriever
    from slime.utils.misc import find_free_port

    data = yaml.safe_load((DATA / EX / "search_tool_config.yaml").read_text())
    second = json.loads(json.dumps(data["tools"][0]))
    second["tool_schema"]["function"]["name"] = "search2"
    data["tools"].append(second)
    with Retriever(["Berlin\nBerlin is the capital of Germany."]) as r:
        for entry in data["tools"]:
            entry["config"]["retrieval_service_url"] = r.url
        path = tmp_path / "two.yaml"
        path.write_text(yaml.safe_dump(data))
        check_services(load_tool_config(path))  # both reachable: nothing raised
        assert r.requests == []  # a connection only: the retriever was asked nothing
    dead = [f"http://127.0.0.1:{find_free_port()}/retrieve", "ftp://example/retrieve"]
    for entry, url in zip(data["tools"], dead):
        entry["config"]["retrieval_service_url"] = url
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ToolConfigError) as e:
        check_services(load_tool_config(path))
    with pytest.raises(ToolConfigError) as on_a_loop:  # called from async code: same answer

        async def from_a_loop():
            check_services(load_tool_config(path))

        asyncio.run(from_a_loop())
    assert str(on_a_loop.value) == str(e.value)
    assert str(e.value).startswith(
        f"{path}: tools[0] ('search').config.retrieval_service_url: cannot reach {dead[0]} (ConnectionRefusedError: "
    )
    assert str(e.value).endswith(") (and 1 more); start the service there or change the URL before the run starts")


# ---- multi-turn rollouts with verl's configs and recipe rows (tests/verl_rollouts.py) ---------------
@without_verl
async def test_gsm8k_yaml_unchanged_runs_verls_gsm8k_recipe_row(stack, tok, tmp_path):
    args, sample, row = recipe_sample(
        stack, tok, "gsm8k_multiturn_w_tool", tmp_path, DATA / EX / "gsm8k_tool_config.yaml", "gsm8k"
    )
    assert sample.label == "72" and sample.metadata["tools_kwargs"] == {
        "calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}
    }
    s = await run_turns(
        stack,
        tok,
        args,
        sample,
        row,
        "Natalia sold clips",
        [
            "<think>\n48 + 24 = 72\n</think>\n\n" + call("calc_gsm8k_reward", {"answer": "72"}),
            "<think>\nconfirmed\n</think>\n\n#### 72",
        ],
        ["Current parsed answer='72' reward=1.0"],
    )
    assert s.metadata["tool_rewards"] == {"calc_gsm8k_reward": 1.0}
    assert s.metadata["step_rewards"] == [{"turn": 1, "tool": "calc_gsm8k_reward", "reward": 0.0}]
    assert s.metadata["outcome_reward"] == 1.0 and s.reward == 2.0  # --tool-reward-mode add: outcome + tool


@without_verl
async def test_geo3k_yaml_unchanged_runs_verls_geo3k_recipe_row(stack, tok, tmp_path):
    """A wrong submission is penalised, the right one (written differently from the ground truth) scores;
    the outcome rule grades the boxed final answer."""
    args, sample, row = recipe_sample(
        stack, tok, "geo3k_multiturn_w_tool", tmp_path, DATA / EX / "geo3k_tool_config.yaml", "math"
    )
    assert sample.label == "2 \\sqrt { 221 }"
    s = await run_turns(
        stack,
        tok,
        args,
        sample,
        row,
        "hypotenuse of the right triangle",
        [
            "<think>\n30 - 8\n</think>\n\n" + call("calc_geo3k_reward", {"answer": "30"}),
            "<think>\nPythagoras\n</think>\n\n" + call("calc_geo3k_reward", {"answer": "2\\sqrt{221}"}),
            "<think>\nconfirmed\n</think>\n\n\\boxed{2\\sqrt{221}}",
        ],
        ["Current parsed answer='30' reward=0.0", "Current parsed answer='2\\\\sqrt{221}' reward=1.0"],
    )
    assert s.metadata["step_rewards"] == [
        {"turn": 1, "tool": "calc_geo3k_reward", "reward": -0.05},
        {"turn": 2, "tool": "calc_geo3k_reward", "reward": 0.0},
    ]
    assert s.metadata["tool_rewards"] == {"calc_geo3k_reward": 1.0}
    assert s.metadata["outcome_reward"] == 1 and s.reward == pytest.approx(1.95)


def with_url(tmp_path: Path, name: str, field: str, url: str) -> Path:
    """verl's YAML with only the service URL changed."""
    data = yaml.safe_load((DATA / name).read_text())
    data["tools"][0]["config"][field] = url
    path = tmp_path / Path(name).name
    path.write_text(yaml.safe_dump(data))
    return path


@without_verl
async def test_search_yaml_runs_verls_search_r1_row_against_a_local_retriever(stack, tok, tmp_path):
    from slime.testing.retriever import Retriever

    with Retriever(["Berlin\nBerlin is the capital of Germany."]) as retriever:
        config = with_url(tmp_path, f"{EX}/search_tool_config.yaml", "retrieval_service_url", retriever.url)
        args, sample, row = recipe_sample(stack, tok, "preprocess_search_r1_dataset", tmp_path, config, None)
        s = await run_turns(
            stack,
            tok,
            args,
            sample,
            row,
            "capital of germany",
            [
                "<think>\nlook it up\n</think>\n\n" + call("search", {"query_list": ["capital of Germany"]}),
                "<think>\nfound it\n</think>\n\n<answer> Berlin </answer>",
            ],
            [json.dumps({"result": "Doc 1 (Title: Berlin)\nBerlin is the capital of Germany."})],
        )
        assert retriever.requests == [{"queries": ["capital of Germany"], "topk": 3, "return_scores": True}]
    assert s.metadata["tool_rewards"] == {"search": 0.0}


@without_verl
async def test_sandbox_fusion_yaml_runs_verls_dapo_row_against_a_local_sandbox(stack, tok, tmp_path):
    from slime.sandbox.server import start_local_sandbox

    url, handle = start_local_sandbox(max_concurrency=2, allow_no_isolation=True)
    try:
        config = with_url(tmp_path, f"{EX}/sandbox_fusion_tool_config.yaml", "sandbox_fusion_url", url)
        args, sample, row = recipe_sample(stack, tok, "dapo_multiturn_w_tool", tmp_path, config, None)
        s = await run_turns(
            stack,
            tok,
            args,
            sample,
            row,
            "first 6 positive odd",
            [
                "<think>\nrun it\n</think>\n\n" + call("code_interpreter", {"code": "print(sum(range(1, 12, 2)))"}),
                "<think>\nit printed 36\n</think>\n\nAnswer: 36",
            ],
            ["36\n"],
        )
    finally:
        handle.stop()
    assert s.metadata["tool_rewards"] == {"code_interpreter": 0.0}


@without_verl
async def test_geo3k_tool_keeps_the_last_submissions_score_as_verl_does():
    from slime.tools.schemas import ToolResponse

    tool = load_tool_config(DATA / EX / "geo3k_tool_config.yaml")["calc_geo3k_reward"]
    iid, _ = await tool.create(create_kwargs={"ground_truth": "0.5"})  # verl's agent loop
    assert await tool.execute(iid, {"answer": "\\frac{1}{2}"}) == (
        ToolResponse(text="Current parsed answer='\\\\frac{1}{2}' reward=1.0"),
        0.0,
        {},
    )
    assert (await tool.execute(iid, {"answer": "x"}))[1:] == (-0.05, {})
    assert await tool.calc_reward(iid) == 0.0  # the last submission's score, not the best
    await tool.release(iid)
    iid, _ = await tool.create("g", ground_truth="3")  # the older convention
    assert iid == "g" and (await tool.execute(iid, {"answer": 3}))[0].text == "Current parsed answer='3' reward=1.0"
    await tool.release(iid)
    assert tool._state == {}


# ---- verl's interactions: the simulated user answers turns without tool calls ----------------------
@without_verl
async def test_gsm8k_interaction_yaml_unchanged_runs_verls_interaction_recipe_row(stack, tok, tmp_path):
    """A wrong answer is answered by the user (masked 0) and retried; the right one ends the conversation,
    its reply recorded but not appended; the turn scores are the interaction's; its instance is finalized."""
    from rollout_plugins.multi_turn import MultiTurnContext
    from slime.interactions.gsm8k_interaction import CORRECT, INCORRECT

    args, sample, row = recipe_sample(
        stack,
        tok,
        "gsm8k_multiturn_w_interaction",
        tmp_path,
        None,
        "gsm8k",
        interaction_config_path=str(DATA / INTERACTION),
    )
    assert sample.metadata["interaction_kwargs"] == row["extra_info"]["interaction_kwargs"]
    gsm8k = MultiTurnContext.get(args).interactions.by_name["gsm8k"].inner
    s = await rollout(
        stack,
        tok,
        args,
        sample,
        row,
        "rethinking carefully",
        ["<think>\n48 + 22\n</think>\n\n#### 70", "<think>\n48 + 24\n</think>\n\n#### 72"],
        [user_delta(tok, INCORRECT)],
    )
    md = s.metadata
    assert s.status == s.Status.COMPLETED and md["finish_reason"] == "interaction_terminated"
    assert md["interaction"] == "gsm8k" and md["turns"] == 2 and md["turn_scores"] == [0.0, 1.0]
    assert md["user_turns"] == [
        {"turn": 1, "content": INCORRECT, "score": 0.0, "terminate": False, "metrics": {}, "appended": True},
        {"turn": 2, "content": CORRECT, "score": 1.0, "terminate": True, "metrics": {}, "appended": False},
    ]
    n1, nu = len(say(tok, "<think>\n48 + 22\n</think>\n\n#### 70", 0)["output_ids"]), len(user_delta(tok, INCORRECT))
    assert [(t["role"], t["start"], t["end"]) for t in md["turn_spans"]] == [
        ("assistant", 0, n1),
        ("user", n1, n1 + nu),
        ("assistant", n1 + nu, s.response_length),
    ]
    assert md["template_drift"] is True  # re-rendering drops the first turn's <think>; the batch keeps it
    assert gsm8k._instance_dict == {}  # finalize_interaction ran


async def test_a_user_interaction_class_by_dotted_path_gets_the_conversation_until_max_user_turns(stack, tok, tmp_path):
    from rollout_plugins.multi_turn import MultiTurnContext

    config = tmp_path / "judge.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "interaction": [
                    {
                        "name": "gsm8k",
                        "class_name": "slime.testing.interactions.ScriptedUser",
                        "config": {"replies": [[False, "Try again.", 0.25], [False, "Once more.", None]]},
                    }
                ]
            }
        )
    )
    args, sample, row = recipe_sample(
        stack,
        tok,
        "gsm8k_multiturn_w_interaction",
        tmp_path,
        None,
        None,
        interaction_config_path=str(config),
        max_user_turns=2,
    )
    judge = MultiTurnContext.get(args).interactions.by_name["gsm8k"].inner
    s = await rollout(
        stack,
        tok,
        args,
        sample,
        row,
        "rethinking carefully",
        ["#### 70", "#### 71", "<think>\nok\n</think>\n\n#### 72"],
        [user_delta(tok, "Try again."), user_delta(tok, "Once more.")],
    )
    md = s.metadata
    assert s.status == s.Status.COMPLETED and md["finish_reason"] == "max_user_turns"
    assert md["turn_scores"] == [0.25] and [u["metrics"] for u in md["user_turns"]] == [{"reply": 1}, {"reply": 2}]
    assert md["template_drift"] is False  # (Qwen3 re-renders thinking only after the last user turn)
    ((iid, kwargs),) = judge.started.items()
    assert kwargs == row["extra_info"]["interaction_kwargs"] and judge.finalized == [iid]
    prompt = row["prompt"]
    assert judge.seen == [
        prompt + [{"role": "assistant", "content": "#### 70"}],
        prompt
        + [
            {"role": "assistant", "content": "#### 70"},
            {"role": "user", "content": "Try again."},
            {"role": "assistant", "content": "#### 71"},
        ],
    ]


async def test_a_user_turn_that_does_not_fit_the_context_is_recorded_not_appended(stack, tok, tmp_path):
    from slime.interactions.gsm8k_interaction import INCORRECT

    args, sample, row = recipe_sample(
        stack,
        tok,
        "gsm8k_multiturn_w_interaction",
        tmp_path,
        None,
        None,
        interaction_config_path=str(DATA / INTERACTION),
    )
    prompt = tok.encode(
        tok.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )
    args.rollout_max_context_len = len(prompt) + len(say(tok, "#### 70", 0)["output_ids"]) + 3
    s = await rollout(stack, tok, args, sample, row, "rethinking carefully", ["#### 70"], [])
    assert s.status == s.Status.TRUNCATED and s.metadata["finish_reason"] == "budget_exhausted_in_user_turn"
    assert s.metadata["user_turns"] == [
        {"turn": 1, "content": INCORRECT, "score": 0.0, "terminate": False, "metrics": {}, "appended": False}
    ]


async def test_a_trajectory_aborted_after_a_user_turn_resumes_at_the_next_turn_with_a_new_instance(
    stack, tok, tmp_path
):
    """--partial-rollout: the rollout aborts while the interaction answers; its reply is appended and the loop stops
    at the turn boundary. The next rollout resumes from every token so far, starts the interaction again (state
    does not outlive a rollout, as for tools) and counts --max-user-turns across both; each instance is finalized."""
    from rollout_plugins.multi_turn import MultiTurnContext, generate
    from slime.rollout.runtime import current, unbind

    config = tmp_path / "judge.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "interaction": [
                    {
                        "name": "gsm8k",
                        "class_name": "slime.testing.interactions.ScriptedUser",
                        "config": {"replies": [[False, "Try again.", 0.0], [False, "Unused.", 0.0]]},
                    }
                ]
            }
        )
    )
    args, sample, row = recipe_sample(
        stack,
        tok,
        "gsm8k_multiturn_w_interaction",
        tmp_path,
        None,
        None,
        interaction_config_path=str(config),
        max_user_turns=1,
        partial_rollout=True,
    )
    runtime = current(args)
    judge = MultiTurnContext.get(args).interactions.by_name["gsm8k"].inner
    answer = judge.generate_response

    def aborting(*a, **kw):  # the rollout aborts while the user is answering
        runtime.client.gate.close()
        return answer(*a, **kw)

    judge.generate_response = aborting
    outs = [say(tok, "#### 70", -1.0), say(tok, "<think>\nok\n</think>\n\n#### 72", -2.0)]
    stack["scripts"].pop("rethinking carefully", None)
    stack["scripts"]["rethinking carefully"] = outs
    try:
        sample = await generate(args, sample, dict(PARAMS))
        first = list(sample.tokens)
        assert sample.status == sample.Status.ABORTED and sample.metadata["finish_reason"] == "rollout_abort"
        assert first[-len(user_delta(tok, "Try again.")) :] == user_delta(tok, "Try again.")
        runtime.client.gate.open()
        n0 = len(stack["engine"].requests)
        sample = await generate(args, sample, dict(PARAMS))
    finally:
        await runtime.client.close()
        unbind(runtime)
    assert [r["input_ids"] for r in stack["engine"].requests[n0:]] == [first]
    assert sample.tokens == first + outs[1]["output_ids"] and sample.metadata["continuations"] == 1
    n1, nu = len(outs[0]["output_ids"]), len(user_delta(tok, "Try again."))
    assert sample.loss_mask == [1] * n1 + [0] * nu + [1] * len(outs[1]["output_ids"])
    assert sample.status == sample.Status.COMPLETED and sample.metadata["finish_reason"] == "max_user_turns"
    assert len(judge.seen) == 1 and len(judge.started) == 2 and sorted(judge.finalized) == sorted(judge.started)
