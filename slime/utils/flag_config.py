"""A subsystem's flags as one frozen, typed config: each field is a flag, its default and range written once.

Why: a default restated at a call site (`getattr(args, "x", default)`) drifts from the parser's, and a
caller that builds its namespace by hand then runs differently from the CLI. Here a package declares
`@dataclass(frozen=True) class XConfig(FlagConfig)` with `flag(...)` fields; the parser's arguments are
generated from them (`add_arguments`), preflight's range check reads their `range` (`ranges`), and
code below the CLI gets `XConfig.from_args(args)`, which reads `args.<field>` with no fallback (a
namespace built by hand is completed from the same defaults by `slime.cli.finalize.complete_namespace`).
Flags upstream slime and Megatron-LM define and we do not are declared once too, by the generated
`slime/cli/upstream_flags.json` (`slime.cli.upstream_flags`); code reads them as `args.<dest>`.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
import math
import typing
from typing import Any, Callable, ClassVar


@dataclass(frozen=True)
class Range:
    """Values `low <= v` (`low < v` when `open_low`) and `v <= high`, plus the `also` values."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    also: tuple[float, ...] = ()
    text: str = ""

    def holds(self, value: float) -> bool:
        if value in self.also:
            return True
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or value <= self.high

    def describe(self) -> str:
        return self.text or " and ".join(
            filter(
                None,
                [
                    None if self.low is None else f"{'>' if self.open_low else '>='} {self.low:g}",
                    None if self.high is None else f"<= {self.high:g}",
                ],
            )
        )


def numbers(value: Any) -> list[float]:
    """The numbers a flag holds (a list flag holds several); bools are switches, not numbers."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in items if isinstance(v, (int, float)) and not isinstance(v, bool)]


def value_problem(option: str, value: Any, rng: Range | None, *, finite: bool = False) -> str | None:
    """Why `value` cannot be flag `option`'s (None: it can, or it is unset): a number outside `rng`, or a float
    that is not finite where `finite` or a range asks for one ("--flag: must be ..., got v")."""
    if value is None:
        return None
    for v in numbers(value):
        if (finite or rng is not None) and isinstance(v, float) and not math.isfinite(v):
            return f"{option}: must be a finite number, got {v}"
        if rng is not None and not rng.holds(v):
            return f"{option}: must be {rng.describe()}, got {v}"
    return None


POSITIVE = Range(0, open_low=True, text="> 0")
AT_LEAST_ONE = Range(1, text=">= 1")
NON_NEGATIVE = Range(0, text=">= 0")
FRACTION = Range(0, 1, text="in [0, 1]")


@dataclass(frozen=True)
class FlagSpec:
    """How one field is a command-line flag (argparse's keywords, plus its range and group)."""

    kwargs: dict[str, Any]
    range: Range | None = None
    group: str | None = None
    options: tuple[str, ...] = ()

    def option_strings(self, name: str) -> tuple[str, ...]:
        """The field `name`'s options: the declared ones, else `--<name>` with dashes."""
        return self.options or ("--" + name.replace("_", "-"),)


def flag(
    default: Any = None,
    *,
    help: str | None = None,
    type: Callable[[str], Any] | None = None,  # noqa: A002
    range: Range | None = None,
    group: str | None = None,
    options: tuple[str, ...] = (),  # noqa: A002
    **argparse_kwargs: Any,
) -> Any:
    """A config field that is the flag `--<field-name>` (or `options`); `argparse_kwargs` are add_argument's
    (choices, action, nargs, metavar). A list default is copied per instance, as argparse's is shared."""
    kwargs = {k: v for k, v in {"help": help, "type": type, **argparse_kwargs}.items() if v is not None}
    if kwargs.get("action") == "store_true" and default is None:
        default = False
    spec = FlagSpec(kwargs, range, group, tuple(options))
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata={"flag": spec})
    return dataclasses.field(default=default, metadata={"flag": spec})


class FlagConfig:
    """Base of a package's frozen flag dataclass: the parser's arguments, defaults and ranges from its fields."""

    GROUP: ClassVar[str] = ""

    @classmethod
    def flag_fields(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if "flag" in f.metadata]  # type: ignore[arg-type]

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """One add_argument per field, grouped as declared."""
        groups: dict[str, Any] = {}
        for f in cls.flag_fields():
            spec: FlagSpec = f.metadata["flag"]
            title = spec.group or cls.GROUP
            if title not in groups:
                groups[title] = parser.add_argument_group(title) if title else parser
            options = spec.option_strings(f.name)
            dest = {} if options[0].lstrip("-").replace("-", "_") == f.name else {"dest": f.name}
            groups[title].add_argument(*options, **dest, default=_default(f), **spec.kwargs)
        return parser

    @classmethod
    def from_args(cls, args: Any) -> Any:
        """The config of a namespace built by our parser (or completed by finalize_args): `args.<field>`,
        no fallback, so a missing flag is an AttributeError naming it rather than a second default."""
        return cls(**{f.name: getattr(args, f.name) for f in cls.flag_fields()})

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every field's default, by dest (for a namespace built by hand)."""
        return {f.name: _default(f) for f in cls.flag_fields()}

    @classmethod
    def ranges(cls) -> dict[str, Range]:
        return {f.name: f.metadata["flag"].range for f in cls.flag_fields() if f.metadata["flag"].range}

    def range_problem(self) -> str | None:
        """The first field outside its declared range, or a float flag that is not finite, named as its flag
        (None: all hold). For a command whose parser is this config alone (`slime-sandbox`); slime's own
        parser checks every config's ranges in preflight (`slime.cli.flag_ranges`)."""
        for f in self.flag_fields():
            spec: FlagSpec = f.metadata["flag"]
            finite = spec.kwargs.get("type") is float
            problem = value_problem(spec.option_strings(f.name)[0], getattr(self, f.name), spec.range, finite=finite)
            if problem:
                return problem
        return None


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return f.default


class ParsedConfig:
    """Base of a frozen config of flags declared elsewhere (upstream slime's and Megatron-LM's, generated into
    the parser from `upstream_flags.json`, or the core parser's). Its fields have no defaults, since the
    parser's are the only ones; `from_args` reads `args.<field>` with no fallback, and a field typed as another
    config (a `FlagConfig` or `ParsedConfig`) is that config read from the same namespace."""

    @classmethod
    def from_args(cls, args: Any) -> Any:
        hints = typing.get_type_hints(cls)
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            part = hints[f.name]
            is_config = isinstance(part, type) and issubclass(part, (FlagConfig, ParsedConfig))
            values[f.name] = part.from_args(args) if is_config else getattr(args, f.name)
        return cls(**values)
