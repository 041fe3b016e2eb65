"""Every field of a JSON body as a path, and the body with one field replaced: how the boundary tests
break one field at a time (hypothesis picks the path and the bad value)."""

from __future__ import annotations

import json
from typing import Any


def paths_of(value: Any, path: tuple = ()) -> list[tuple]:
    """Every field of a body, as a path of keys and indices."""
    out = [path] if path else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths_of(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths_of(v, path + (i,))
    return out


def replaced(body: Any, path: tuple, value: Any) -> Any:
    """A deep copy of `body` with the field at `path` set to `value`."""
    body = json.loads(json.dumps(body))
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return body
