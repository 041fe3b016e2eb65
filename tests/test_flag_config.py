"""Each flag's default is written once: in a package's typed config (`slime.utils.flag_config`) or the core
parser, never restated at a call site as `getattr(args, "flag", default)` (issue #33)."""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path

import pytest

from slime.cli.flag_ranges import RANGES
from slime.cli.parser import build_parser, flag_configs
from slime.utils.flag_config import FlagConfig, flag

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("slime", "rollout_plugins", "tools")


def _flag_dests() -> set[str]:
    return {a.dest for a in build_parser()._actions if a.option_strings}  # noqa: SLF001


def restated_defaults(root: Path = ROOT) -> dict[str, list[str]]:
    """file -> the flags it reads as `getattr(<...args>, "flag", default)` or `flag_value(<...>, "flag", default)`."""
    dests = _flag_dests()
    out: dict[str, list[str]] = {}
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if not (
                    isinstance(node, ast.Call)
                    and len(node.args) == 3
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "flag_value")
                ):
                    continue
                target, name = node.args[0], node.args[1]
                reads_args = ast.unparse(target).split(".")[-1].endswith("args")
                if reads_args and isinstance(name, ast.Constant) and name.value in dests:
                    out.setdefault(rel, []).append(f"{name.value} (line {node.lineno})")
    return out


def test_no_flag_default_is_restated_at_a_call_site():
    """Every package reads `args.x` (a namespace from outside is completed where it enters, by
    `slime.utils.plugin_args.completed`): the allowlist of files not converted is gone."""
    found = restated_defaults()
    assert not found, f"flag defaults restated at call sites (read args.x; complete the namespace at entry): {found}"


def test_the_scan_finds_a_restated_default(tmp_path):
    (tmp_path / "slime").mkdir()
    (tmp_path / "slime" / "x.py").write_text(
        'def f(args, self):\n    return getattr(args, "max_turns", 8), '
        'getattr(self.args, "use_wandb", False), getattr(args, "nope", 1)\n'
    )
    assert restated_defaults(tmp_path) == {"slime/x.py": ["max_turns (line 2)", "use_wandb (line 2)"]}


@pytest.mark.parametrize("config", flag_configs(), ids=lambda c: c.__name__)
def test_config_from_the_parsers_defaults_is_the_configs_defaults(config):
    assert config.from_args(build_parser().parse_args([])) == config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config(), config.flag_fields()[0].name, None)


def test_config_from_args_has_no_fallback():
    """A namespace missing a flag is an error naming it, not a second default."""
    from slime.tools.flags import ToolConfig

    with pytest.raises(AttributeError, match="max_turns"):
        ToolConfig.from_args(argparse.Namespace(**{k: v for k, v in ToolConfig.defaults().items() if k != "max_turns"}))


def _parser_literal_dests() -> list[str]:
    """The dests `slime/cli/parser.py` declares itself (`add_argument("--x", ...)` literals)."""
    tree = ast.parse((ROOT / "slime/cli/parser.py").read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            dest = next((k.value.value for k in node.keywords if k.arg == "dest"), None)
            first = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
            out.append(dest or first.lstrip("-").replace("-", "_"))
    return out


def test_no_flag_default_is_declared_twice():
    literal = _parser_literal_dests()
    assert len(literal) == len(set(literal)) and len(literal) > 20
    declared = list(literal)
    for config in flag_configs():
        assert issubclass(config, FlagConfig) and config.__dataclass_params__.frozen
        declared += [f.name for f in config.flag_fields()]
    twice = sorted({d for d in declared if declared.count(d) > 1})
    assert not twice, f"flags declared in two places: {twice}"
    # every config flag is a parser flag with the config's default, and its range is preflight's
    actions = {a.dest: a for a in build_parser()._actions}  # noqa: SLF001
    for config in flag_configs():
        for name, default in config.defaults().items():
            assert actions[name].default == default, name
        for name, rng in config.ranges().items():
            assert RANGES[name] is rng


def test_generated_arguments_match_a_hand_written_parser():
    @dataclasses.dataclass(frozen=True)
    class Demo(FlagConfig):
        GROUP = "demo"
        size: int = flag(3, type=int, help="a size")
        paths: list = flag([], action="append")
        on: bool = flag(False, action="store_true", options=("--switch",))

    p = Demo.add_arguments(argparse.ArgumentParser())
    args = p.parse_args(["--size", "5", "--paths", "a", "--paths", "b", "--switch"])
    assert Demo.from_args(args) == Demo(size=5, paths=["a", "b"], on=True)
    assert Demo.from_args(p.parse_args([])) == Demo() and Demo().paths is not Demo().paths


def test_a_zero_gamma_is_read_as_zero_not_as_a_restated_default():
    """`float(getattr(args, "gamma", 1.0) or 1.0)` read --gamma 0 as 1: REINFORCE++ discounted nothing."""
    import torch

    from slime.train.flags import LossConfig
    from slime.train.loss import advantages_for

    args = build_parser().parse_args(["--advantage-estimator", "reinforce_plus_plus", "--gamma", "0"])
    assert advantages_for(LossConfig.from_args(args), [1.0], [torch.ones(3)], None)[0].tolist() == [0.0, 0.0, 1.0]


def test_a_namespace_built_by_hand_gets_the_parsers_defaults_where_it_enters():
    """slime's train.py, its tests and a plugin's caller hand us partial namespaces. Where one enters (here the
    data source, as slime's buffer-filter contract builds it) it is completed once, in place, with the parser's
    values: the fallbacks restated at call sites gave `custom_generate_timeout` None (no deadline), a
    `metadata_key` of None (the row's metadata ignored) and group seeds from 0 instead of --rollout-seed 42."""
    from types import SimpleNamespace

    from slime.rollout.data_source import DataSource
    from slime.rollout.flags import RolloutConfig
    from slime.utils.plugin_args import completed

    args = SimpleNamespace(n_samples_per_prompt=2, rollout_seed=7)
    source = DataSource(args, [], 2)
    assert source.args is args and source.seed == 7  # what the caller set is kept
    assert (args.custom_generate_timeout, args.metadata_key, args.abort_timeout) == (3600.0, "metadata", 5.0)
    assert RolloutConfig.from_args(completed(SimpleNamespace())) == RolloutConfig()
    parsed = build_parser().parse_args([])
    before = dict(vars(parsed))
    assert completed(parsed) is parsed and {k: getattr(parsed, k) for k in before} == before
