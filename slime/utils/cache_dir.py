"""Where slime keeps what it can rebuild (the default model, agent CLIs for tests, transformers' import
table): `$SLIME_CACHE`, else ~/.cache/slime. One definition, read at call time (tests point it elsewhere)."""

from __future__ import annotations

import os
from pathlib import Path


def slime_cache_dir() -> Path:
    return Path(os.environ.get("SLIME_CACHE") or Path.home() / ".cache" / "slime")
