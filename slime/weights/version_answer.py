"""An engine's `/get_weight_version` answer, checked before it is believed.

The fleet admits a replaced engine only when its weight version is the one the others serve, so a
version read off a broken answer would let an engine serve stale weights. The rule is `/generate`'s
(slime.rollout.engine_answer): a body that is not SGLang's `{"weight_version": "<non-empty string>"}`
is that engine's fault, raised as `BadWeightVersion` (reason `engine_bad_answer:<field>`, counted by
the caller) naming the field with a short excerpt; nothing is guessed from it.
"""

from __future__ import annotations

import json
import reprlib
from typing import Any

from slime.utils.answer_error import AnswerError

MAX_VERSION_CHARS = 256  # slime's versions are rollout ids ("12") or labels; longer is not a version
EXCERPT_CHARS = 120

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = EXCERPT_CHARS
_SHORT.maxlist = _SHORT.maxdict = 6


class BadWeightVersion(AnswerError):
    """A `/get_weight_version` answer that breaks SGLang's shape; `field` names the wrong part."""

    def __init__(self, field: str, problem: str, excerpt: Any, engine: str = ""):
        self.field = field
        text = excerpt if isinstance(excerpt, str) else _SHORT.repr(excerpt)
        text = text[:EXCERPT_CHARS] + ("..." if len(text) > EXCERPT_CHARS else "")
        where = f"{engine}: " if engine else ""
        super().__init__(
            f"{where}bad /get_weight_version answer ({field}): {problem}: {text}", reason=f"engine_bad_answer:{field}"
        )
        self._parts = (field, problem, text, engine)

    def __reduce__(self) -> tuple[Any, ...]:
        """Rebuilt whole from its parts: it crosses Ray (raised in an engine's actor), and the fleet tells
        a bad answer by its type and field (pickle's default would call `__init__` with the message alone)."""
        return type(self), self._parts


def parse_weight_version_answer(body: Any, engine: str = "") -> str:
    """The version an engine reports; `body` is the answer's text or its decoded JSON. `engine` names
    the engine in the error."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except (ValueError, RecursionError) as e:
            raise BadWeightVersion("body", f"not JSON ({type(e).__name__})", body, engine) from None
    if not isinstance(body, dict):
        raise BadWeightVersion("body", f"a JSON {type(body).__name__}, not an object", body, engine)
    if "weight_version" not in body:
        raise BadWeightVersion("weight_version", "missing", body, engine)
    version = body["weight_version"]
    if not isinstance(version, str):
        raise BadWeightVersion("weight_version", f"a {type(version).__name__}, not a string", version, engine)
    if not version or len(version) > MAX_VERSION_CHARS or not version.isprintable():
        raise BadWeightVersion(
            "weight_version",
            f"not a version (empty, over {MAX_VERSION_CHARS} characters, or unprintable)",
            version,
            engine,
        )
    return version
