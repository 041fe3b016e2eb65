"""`scripted_fleet`: scripted engines behind a real sglang-router of their own, for the block's duration."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Sequence

from slime.fleet.router import Router
from slime.testing.scripted_engine import Script, ScriptedEngine


@contextlib.contextmanager
def scripted_fleet(scripts: Sequence[Script], model_dir: str | Path) -> Iterator[tuple[Router, list[ScriptedEngine]]]:
    """One engine per script (the same script twice: two engines answering alike), each a worker of
    the router; yields ``(router, engines)`` and stops the router, then the engines."""
    engines = [ScriptedEngine(s, str(model_dir)).start() for s in scripts]
    router = Router().start()
    try:
        for e in engines:
            router.add_worker(e.url)
        yield router, engines
    finally:
        router.stop()
        for e in engines:
            e.stop()
