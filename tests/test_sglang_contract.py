"""Our SGLang command line and HTTP bodies against the pinned SGLang's own definitions, without a GPU.

SGLang cannot be imported on a CPU machine with our pinned stack (see tools/gen_sglang_contract.py),
so its contract is read from its source into tests/fixtures/sglang_contract.json: the options of
`sglang.launch_server` (rebuilt here as an argparse parser with SGLang's option strings, arities,
types and choices), the fields of each request class, and the HTTP routes. SGLang's HTTP layer
ignores unknown keys, so an extra key is reported here as the silent no-op it would be there.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Set, Tuple, Union

import pydantic
import pytest

from slime.cli.args import parse_args
from slime.fleet import sglang_payloads as P
from slime.fleet.engine_server import base_gpu_id, sglang_server_args
from slime.fleet.flags import EngineConfig
from slime.rollout.sglang_rollout import sampling_params_from_args

SGLANG_VERSION = "0.5.15.post1"  # upstream slime's image (docker/Dockerfile), = tools/gen_sglang_contract.py
FIXTURE = Path(__file__).parent / "fixtures" / "sglang_contract.json"
REGENERATE = "python tools/gen_sglang_contract.py (reads the sglang wheel's source; needs PyPI)"


@pytest.fixture(scope="module")
def contract() -> dict[str, Any]:
    assert FIXTURE.exists(), f"{FIXTURE} is missing: regenerate it with {REGENERATE}"
    c = json.loads(FIXTURE.read_text())
    assert c["sglang_version"] == SGLANG_VERSION, f"fixture is for sglang {c['sglang_version']}: {REGENERATE}"
    return c


# ---------------------------------------------------------------- the server command line


class ParseError(AssertionError):
    pass


class StrictParser(argparse.ArgumentParser):
    def error(self, message: str):  # an assertion naming the flag, not a SystemExit
        raise ParseError(message)


def sglang_parser(contract: dict[str, Any]) -> StrictParser:
    """`sglang.launch_server`'s options as SGLang declares them (no abbreviations, like a typo check)."""
    p = StrictParser(prog="sglang.launch_server", allow_abbrev=False)
    types = {"int": int, "float": float, "str": str}
    for o in contract["server_args"]:
        kw: dict[str, Any] = {"dest": o["dest"]}
        if o["kind"] == "flag":
            kw["action"] = "store_true"
        elif o["kind"] == "boolean_optional":
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw.update(type=types[o["type"]], nargs=o["nargs"], choices=o["choices"], required=o["required"])
        p.add_argument(*o["option_strings"], **kw)
    return p


def slime_args(tmp_path: Path, *extra: str, gpus: int = 8, per_engine: int = 2) -> argparse.Namespace:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1?", "label": "2"}\n')
    return parse_args(
        [
            "--rollout-backend",
            "sglang",
            "--hf-checkpoint",
            str(model),
            "--prompt-data",
            str(data),
            "--rollout-num-gpus",
            str(gpus),
            "--rollout-num-gpus-per-engine",
            str(per_engine),
            "--num-gpus-per-node",
            "8",
            *extra,
        ]
    )


def engine_config(tmp_path: Path, *extra: str, gpus: int = 8, per_engine: int = 2) -> EngineConfig:
    """What an engine actor receives of that command line (`EngineConfig.from_args`)."""
    return EngineConfig.from_args(slime_args(tmp_path, *extra, gpus=gpus, per_engine=per_engine))


def test_single_node_engine_command_parses(contract, tmp_path):
    args = engine_config(tmp_path, "--sglang-mem-fraction-static", "0.65", "--rollout-seed", "7")
    cmd = sglang_server_args(args, host="127.0.0.1", port=30001, base_gpu_id=base_gpu_id(args, 3), tp_size=2)
    ns = sglang_parser(contract).parse_args(cmd)
    assert (ns.model_path, ns.host, ns.port, ns.tp_size, ns.base_gpu_id) == (
        str(tmp_path / "model"),
        "127.0.0.1",
        30001,
        2,
        6,
    )
    assert (ns.mem_fraction_static, ns.random_seed, ns.skip_server_warmup, ns.trust_remote_code) == (
        0.65,
        7,
        True,
        True,
    )
    assert ns.enable_memory_saver is False and ns.nnodes is None


def test_multi_node_offload_and_passthrough_command_parses(contract, tmp_path):
    args = engine_config(
        tmp_path,
        "--offload",
        "--sglang-cuda-graph-bs",
        "1",
        "2",
        "4",
        "8",
        "--sglang-enable-metrics",
        "--sglang-attention-backend",
        "fa3",
        "--sglang-max-running-requests=64",
        "--sglang-dtype",
        "bfloat16",
        "--sglang-lora-target-modules",
        "q_proj",
        "v_proj",
        gpus=16,
        per_engine=16,
    )
    cmd = sglang_server_args(
        args,
        host="10.0.0.2",
        port=30002,
        base_gpu_id=base_gpu_id(args, 0),
        tp_size=16,
        nnodes=2,
        node_rank=1,
        dist_init_addr="10.0.0.1:5000",
    )
    ns = sglang_parser(contract).parse_args(cmd)
    assert (ns.tp_size, ns.nnodes, ns.node_rank, ns.dist_init_addr, ns.base_gpu_id) == (16, 2, 1, "10.0.0.1:5000", 0)
    assert ns.enable_memory_saver is True
    assert ns.cuda_graph_bs_decode == [1, 2, 4, 8]  # a list value stays a list (nargs="+" of int)
    assert ns.lora_target_modules == ["q_proj", "v_proj"]
    assert (ns.enable_metrics, ns.attention_backend, ns.max_running_requests, ns.dtype) == (True, "fa3", 64, "bfloat16")


def test_pipeline_parallel_splits_the_engine_gpus(contract, tmp_path):
    args = engine_config(tmp_path, "--sglang-pp-size", "2", per_engine=4)
    ns = sglang_parser(contract).parse_args(sglang_server_args(args, host="h", port=1, base_gpu_id=0, tp_size=4))
    assert (ns.tp_size, ns.pp_size) == (2, 2)
    with pytest.raises(ValueError, match=r"--sglang-pp-size 3 must divide the engine's 4 GPUs"):
        sglang_server_args(dataclasses.replace(args, sglang_pp_size=3), host="h", port=1, base_gpu_id=0, tp_size=4)


def test_command_line_errors_name_the_flag(contract, tmp_path):
    args = engine_config(tmp_path, "--sglang-tp-size", "4")
    with pytest.raises(ValueError, match=r"--sglang-tp-size is set by slime; use --rollout-num-gpus-per-engine"):
        sglang_server_args(args, host="h", port=1, base_gpu_id=0, tp_size=2)
    args = engine_config(tmp_path, gpus=16, per_engine=16)
    with pytest.raises(ValueError, match=r"over 2 nodes needs dist_init_addr"):
        sglang_server_args(args, host="h", port=1, base_gpu_id=0, tp_size=16, nnodes=2, node_rank=1)
    # what SGLang's own parser would refuse at start-up is caught here, before any GPU is asked for
    parser = sglang_parser(contract)
    bad = sglang_server_args(
        engine_config(tmp_path, "--sglang-no-such-option", "1"), host="h", port=1, base_gpu_id=0, tp_size=2
    )
    with pytest.raises(ParseError, match=r"unrecognized arguments: --no-such-option 1"):
        parser.parse_args(bad)
    bad = sglang_server_args(
        engine_config(tmp_path, "--sglang-dtype", "fp7"), host="h", port=1, base_gpu_id=0, tp_size=2
    )
    with pytest.raises(ParseError, match=r"--dtype: invalid choice: 'fp7'"):
        parser.parse_args(bad)


def test_parser_knows_what_slime_relies_on(contract):
    """The options we emit keep their arity in the pinned SGLang (a switch that starts taking a value,
    or a renamed option, breaks every engine start)."""
    by_flag = {s: o for o in contract["server_args"] for s in o["option_strings"]}
    switches = ["--skip-server-warmup", "--trust-remote-code", "--enable-memory-saver"]
    valued = {
        "--model-path": "str",
        "--host": "str",
        "--port": "int",
        "--tp-size": "int",
        "--pp-size": "int",
        "--base-gpu-id": "int",
        "--nnodes": "int",
        "--node-rank": "int",
        "--dist-init-addr": "str",
        "--mem-fraction-static": "float",
        "--random-seed": "int",
        "--config": "str",
    }
    assert [by_flag[f]["kind"] for f in switches] == ["flag"] * 3
    assert {f: (by_flag[f]["kind"], by_flag[f]["nargs"], by_flag[f]["type"]) for f in valued} == {
        f: ("value", None, t) for f, t in valued.items()
    }
    assert [o["dest"] for o in contract["server_args"] if o["required"]] == ["model_path"]


# ---------------------------------------------------------------- HTTP bodies

KNOWN_TYPES = {
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
    "bytes": bytes,
    "Any": Any,
    "List": List,
    "Dict": Dict,
    "Optional": Optional,
    "Union": Union,
    "Literal": Literal,
    "Set": Set,
    "Tuple": Tuple,
    "list": list,
    "dict": dict,
    "set": set,
    "tuple": tuple,
    "None": None,
}


class _Loosen(ast.NodeTransformer):
    """`Annotated[T, marker]` -> T; a name not in KNOWN_TYPES (an SGLang class) -> Any."""

    def visit_Subscript(self, node: ast.Subscript):
        if isinstance(node.value, ast.Name) and node.value.id in ("Annotated", "A"):
            inner = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) else node.slice
            return self.visit(inner)
        if isinstance(node.value, ast.Name) and node.value.id == "Literal":
            return node
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name):
        return node if node.id in KNOWN_TYPES else ast.copy_location(ast.Name("Any", ast.Load()), node)

    def visit_Attribute(self, node: ast.Attribute):
        return ast.copy_location(ast.Name("Any", ast.Load()), node)


def annotation_type(source: str) -> Any:
    tree = ast.fix_missing_locations(_Loosen().visit(ast.parse(source, mode="eval")))
    return eval(compile(tree, "<sglang annotation>", "eval"), {"__builtins__": {}}, dict(KNOWN_TYPES))  # noqa: S307


def assert_valid(contract: dict[str, Any], cls_name: str, body: dict[str, Any]) -> None:
    """`cls_name(**body)` as SGLang would build it: every key a field, every required field there,
    every value of the field's type (pydantic, as FastAPI validates the body)."""
    fields = contract["requests"][cls_name]["fields"]
    unknown = sorted(set(body) - set(fields))
    assert not unknown, (
        f"sglang {contract['sglang_version']} {cls_name} has no field(s) {unknown}: SGLang's HTTP "
        f"layer would silently ignore them (fields: {sorted(fields)})"
    )
    missing = sorted(f for f, spec in fields.items() if not spec["has_default"] and f not in body)
    assert not missing, f"{cls_name} requires {missing}; our body has {sorted(body)}"
    for key, value in body.items():
        try:
            pydantic.TypeAdapter(annotation_type(fields[key]["annotation"])).validate_python(value)
        except pydantic.ValidationError as e:
            raise AssertionError(f"{cls_name}.{key}: {value!r} is not a {fields[key]['annotation']}: {e}") from None


# endpoint function -> the request class SGLang's route parses the body into (None: no body)
REQUEST_CLASS = {
    "generate": "GenerateReqInput",
    "abort_request": "AbortReq",
    "flush_cache": None,
    "pause_generation": "PauseGenerationReqInput",
    "continue_generation": "ContinueGenerationReqInput",
    "release_memory_occupation": "ReleaseMemoryOccupationReqInput",
    "resume_memory_occupation": "ResumeMemoryOccupationReqInput",
    "update_weights_from_disk": "UpdateWeightFromDiskReqInput",
    "update_weights_from_tensor": "UpdateWeightsFromTensorReqInput",
    "init_weights_update_group": "InitWeightsUpdateGroupReqInput",
    "update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
    "destroy_weights_update_group": "DestroyWeightsUpdateGroupReqInput",
    "check_weights": "CheckWeightsReqInput",
}


def test_every_endpoint_is_a_route_of_the_pinned_sglang(contract):
    assert set(P.ENDPOINTS) == set(REQUEST_CLASS)
    for fn, (method, path) in P.ENDPOINTS.items():
        route = contract["routes"].get(path)
        assert route is not None, f"{fn}: sglang {SGLANG_VERSION} has no route {path}"
        assert method in route["methods"], f"{fn}: {path} accepts {route['methods']}, not {method}"
        assert route["body"] == REQUEST_CLASS[fn], f"{fn}: {path} parses its body into {route['body']}"


BODIES = {
    "generate": [
        P.generate([1, 2, 3], {"max_new_tokens": 8, "temperature": 1.0}, rid="slime-1-0"),
        P.generate(
            [1, 151655, 3], {"max_new_tokens": 8}, rid="slime-1-1", image_data=["data:image/png;base64,iVBORw0KGgo="]
        ),
    ],
    "abort_request": [P.abort_request(rid="slime-1-0"), P.abort_request(abort_all=True)],
    "pause_generation": [P.pause_generation(), P.pause_generation("retract"), P.pause_generation("in_place")],
    "continue_generation": [P.continue_generation()],
    "release_memory_occupation": [P.release_memory_occupation(), P.release_memory_occupation(["kv_cache"])],
    "resume_memory_occupation": [P.resume_memory_occupation(), P.resume_memory_occupation(["weights", "kv_cache"])],
    "update_weights_from_disk": [
        P.update_weights_from_disk("/ckpt/iter_3"),
        P.update_weights_from_disk("/ckpt/iter_3", weight_version="3", load_format="auto"),
    ],
    "update_weights_from_tensor": [
        P.update_weights_from_tensor(["AAEC", "AwQF"]),
        P.update_weights_from_tensor(["AAEC"], flush_cache=True, weight_version="4", load_format="flattened_bucket"),
    ],
    "init_weights_update_group": [P.init_weights_update_group("10.0.0.1", 29500, 1, 9, "slime")],
    "update_weights_from_distributed": [
        P.update_weights_from_distributed(
            ["model.embed_tokens.weight", "lm_head.weight"],
            ["torch.bfloat16", "float32"],
            [(8, 4), [8, 4]],
            "slime",
            flush_cache=True,
            weight_version="5",
        )
    ],
    "destroy_weights_update_group": [P.destroy_weights_update_group("slime")],
    "check_weights": [P.check_weights(a) for a in P.CHECK_WEIGHTS_ACTIONS],
}


@pytest.mark.parametrize("fn", sorted(BODIES))
def test_every_body_validates_against_sglangs_request_class(contract, fn):
    for body in BODIES[fn]:
        assert_valid(contract, REQUEST_CLASS[fn], body)


def test_bodies_are_exact(contract):
    assert P.generate((5, 6), {"top_k": -1}, rid="r") == {
        "input_ids": [5, 6],
        "sampling_params": {"top_k": -1},
        "return_logprob": True,
        "rid": "r",
    }
    assert P.update_weights_from_distributed(["w"], ["torch.bfloat16"], [(2, 3)], "g") == {
        "names": ["w"],
        "dtypes": ["bfloat16"],
        "shapes": [[2, 3]],
        "group_name": "g",
        "flush_cache": False,
    }
    assert P.flush_cache() == {} and P.update_weights_from_disk("/m") == {"model_path": "/m"}
    assert P.generate([5], {}, rid="r", image_data=["data:image/png;base64,AA=="])["image_data"] == [
        "data:image/png;base64,AA=="
    ]
    assert "image_data" not in P.generate([5], {}, rid="r", image_data=[])  # no images: SGLang's default


def test_bad_arguments_are_refused_before_sending():
    with pytest.raises(ValueError, match=r"mode must be one of \('abort', 'retract', 'in_place'\), got 'stop'"):
        P.pause_generation("stop")
    with pytest.raises(ValueError, match=r"unknown tag\(s\) \['kv'\]"):
        P.release_memory_occupation(["kv"])
    with pytest.raises(ValueError, match=r"give either rid or abort_all=True"):
        P.abort_request()
    with pytest.raises(ValueError, match=r"1 names, 2 dtypes, 1 shapes"):
        P.update_weights_from_distributed(["w"], ["bfloat16", "bfloat16"], [[1]], "g")
    with pytest.raises(ValueError, match=r"action must be one of"):
        P.check_weights("verify")


def test_contract_check_catches_a_silently_ignored_key(contract):
    with pytest.raises(AssertionError, match=r"InitWeightsUpdateGroupReqInput has no field\(s\) \['timeout'\]"):
        assert_valid(
            contract,
            "InitWeightsUpdateGroupReqInput",
            {**P.init_weights_update_group("h", 1, 1, 2, "g"), "timeout": 30},
        )
    with pytest.raises(AssertionError, match=r"UpdateWeightFromDiskReqInput requires \['model_path'\]"):
        assert_valid(contract, "UpdateWeightFromDiskReqInput", {"weight_version": "1"})
    with pytest.raises(AssertionError, match=r"InitWeightsUpdateGroupReqInput.master_port: 'x'"):
        assert_valid(
            contract,
            "InitWeightsUpdateGroupReqInput",
            {**P.init_weights_update_group("h", 1, 1, 2, "g"), "master_port": "x"},
        )


@pytest.mark.parametrize("evaluation", [False, True])
def test_sampling_params_we_send_are_sglangs(contract, tmp_path, evaluation):
    args = slime_args(
        tmp_path,
        "--rollout-stop",
        "</s>",
        "\n\n",
        "--rollout-stop-token-ids",
        "7",
        "9",
        "--rollout-temperature",
        "0.8",
        "--rollout-top-k",
        "20",
    )
    params = sampling_params_from_args(args, evaluation=evaluation)
    assert {"max_new_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids"} <= set(params)
    assert_valid(contract, "SamplingParams", params)
    assert_valid(contract, "GenerateReqInput", P.generate([1], params, rid="slime-0-1"))
