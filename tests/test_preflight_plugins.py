"""Preflight imports every plugin a command names (a bad path is an error before anything starts), except the
function slime defaults to, whose import cost the command ~0.7 s before its engines' preload and Ray could start
(issue 31, cold start). That default is slime's own: this file is the check preflight no longer makes."""

from __future__ import annotations

from slime.cli.args import parse_args
from slime.cli.parser import build_parser
from slime.cli.preflight import PLUGIN_FLAGS, PreflightError, plugins_to_load, preflight
from slime.utils.misc import load_function


def _args(tmp_path, *extra: str):
    data = tmp_path / "p.jsonl"
    data.write_text('{"input": "hi", "label": "x"}\n')
    return parse_args(["--prompt-data", str(data), "--rm-type", "exact", "--debug-rollout-only", *extra])


def test_every_plugin_default_slime_declares_loads():
    parser = build_parser()
    named = {dest: parser.get_default(dest) for dest in PLUGIN_FLAGS if parser.get_default(dest)}
    assert named == {
        "rollout_function_path": "slime.rollout.sglang_rollout.generate_rollout",
        "data_source_path": "slime.rollout.data_source.RolloutDataSourceWithBuffer",
    }
    for dest, path in named.items():
        assert callable(load_function(path, "--" + dest.replace("_", "-")))


def test_the_default_is_not_imported_again_but_every_other_plugin_is(tmp_path):
    assert plugins_to_load(_args(tmp_path)) == []  # the eval path defaults to the rollout path: skipped too
    other = "slime.rollout.sft_rollout.generate_rollout"
    args = _args(tmp_path, "--rollout-function-path", other, "--custom-generate-function-path", "my_pkg.gen.generate")
    assert plugins_to_load(args) == ["rollout_function_path", "eval_function_path", "custom_generate_function_path"]


def test_a_misspelt_slime_path_is_still_an_error_before_anything_starts(tmp_path):
    args = _args(tmp_path, "--rollout-function-path", "slime.rollout.sglang_rollout.generate_rollut")
    try:
        preflight(args)
    except PreflightError as e:
        assert "--rollout-function-path" in str(e) and "generate_rollut" in str(e)
    else:
        raise AssertionError("a misspelt plugin path passed preflight")
