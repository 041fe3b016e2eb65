"""`completed(args)`: where a namespace from outside (a slime plugin's caller, slime's tests, a train.py-style
script) enters our code, it gets every flag it lacks with the parser's default.

Why here and not at each read: code below reads `args.x` with no fallback, so a default is written once
(in the parser or a package's config). A namespace made by `parse_args` is returned at once; one built by hand
is completed in place, once (the completed namespace then looks parsed). The parser is imported when called:
it sits on top of every package, and only its declarations (no command) are needed here.
"""

from __future__ import annotations

import argparse
from typing import Any


def completed(args: Any) -> Any:
    """`args`, with every parser flag it lacks set to the parser's default (in place)."""
    if args is None or (hasattr(args, "sglang_extra_args") and hasattr(args, "eps_clip")):
        return args  # made by parse_args, or completed before
    from slime.cli.parser import build_parser

    for action in build_parser()._actions:  # noqa: SLF001
        if (
            action.dest not in ("help", argparse.SUPPRESS)
            and not hasattr(args, action.dest)
            and action.default is not argparse.SUPPRESS
        ):
            value = action.default
            if isinstance(value, str) and callable(action.type):  # as argparse converts string defaults
                value = action.type(value)
            setattr(args, action.dest, value)
    if not hasattr(args, "sglang_extra_args"):
        args.sglang_extra_args = {}
    return args
