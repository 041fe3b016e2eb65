"""The first runtime a rollout process binds freezes the start-up heap out of garbage collection, once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _runs_ok(code: str, **env: str) -> None:
    """`code` in a fresh interpreter (a heap no other test has frozen) prints "ok"."""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_the_first_binding_freezes_the_startup_heap_once() -> None:
    code = textwrap.dedent("""
        import argparse, gc
        from slime.rollout.engine_client import EngineClient
        from slime.rollout.runtime import RolloutRuntime, unbind
        from slime.utils.endpoints import Endpoints
        from slime.utils.gc_freeze import freeze_startup_heap

        from slime.utils.gc_freeze import YOUNG_THRESHOLD

        assert gc.get_freeze_count() == 0 and gc.get_threshold() == (700, 10, 10)
        runtime = RolloutRuntime(argparse.Namespace(), EngineClient(Endpoints(None, [])))
        runtime.bind()
        frozen = gc.get_freeze_count()
        assert frozen > 1000, frozen  # the modules imported above, at least
        # young collections every YOUNG_THRESHOLD allocations, not CPython's 700 (the other two kept)
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10) and YOUNG_THRESHOLD > 700
        runtime.bind()
        assert gc.get_freeze_count() == frozen and not freeze_startup_heap()
        unbind(runtime)
        print("ok")
    """)
    _runs_ok(code)


def test_a_gateway_started_outside_a_runtime_freezes_the_startup_heap_once() -> None:
    """A gateway embedded without a rollout runtime (a script, a benchmark) leaves the process's heap out of
    collection too: its sessions' objects would otherwise trigger full collections walking all of it."""
    code = textwrap.dedent("""
        import gc
        from transformers import AutoTokenizer
        from slime.agent.gateway.server import Gateway
        from slime.rollout.engine_client import EngineClient
        from slime.testing.tiny_model import qwen_tokenizer_dir
        from slime.utils.endpoints import Endpoints

        tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
        gateway = Gateway(EngineClient(Endpoints(None, []), tokenizer=tok), tokenizer=tok)
        assert gc.get_freeze_count() == 0
        gateway.start()
        frozen = gc.get_freeze_count()
        assert frozen > 1000, frozen
        gateway.stop()
        Gateway(EngineClient(Endpoints(None, []), tokenizer=tok), tokenizer=tok).start().stop()
        assert gc.get_freeze_count() == frozen  # once per process
        print("ok")
    """)
    _runs_ok(code, HF_HUB_OFFLINE="1")


def test_a_process_that_set_its_own_collection_thresholds_keeps_them() -> None:
    code = textwrap.dedent("""
        import gc
        from slime.utils.gc_freeze import YOUNG_THRESHOLD, freeze_startup_heap

        gc.set_threshold(YOUNG_THRESHOLD * 2, 5, 5)  # larger than ours: kept
        assert freeze_startup_heap() and gc.get_threshold() == (YOUNG_THRESHOLD * 2, 5, 5)
        print("ok")
    """)
    _runs_ok(code)
    code = textwrap.dedent("""
        import gc
        from slime.utils.gc_freeze import freeze_startup_heap

        gc.set_threshold(0)  # collection turned off by the process's owner: left off
        assert freeze_startup_heap() and gc.get_threshold()[0] == 0
        print("ok")
    """)
    _runs_ok(code)


def test_a_start_up_with_collection_paused_runs_without_collections_then_freezes_what_it_built() -> None:
    """`collection_paused` (the engine fork server's preload, a cold engine's load): no collection inside the
    block, even past many thresholds' worth of container allocations; afterwards what it built is frozen and
    collection is back as it was, also when the block raised or collection was already off."""
    code = textwrap.dedent("""
        import gc
        from slime.utils.gc_freeze import collection_paused

        collections = []
        gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info["generation"]))
        assert gc.isenabled() and gc.get_freeze_count() == 0
        with collection_paused():
            assert not gc.isenabled()
            kept = [[i] for i in range(200_000)]  # ~285 young collections' worth at CPython's 700
        assert collections == [], collections
        assert gc.isenabled() and gc.get_freeze_count() >= len(kept)
        frozen = gc.get_freeze_count()
        try:
            with collection_paused():
                more = [[] for _ in range(1000)]
                raise RuntimeError("a failed preload")
        except RuntimeError:
            pass
        assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(more)
        gc.disable()
        with collection_paused():
            pass
        assert not gc.isenabled()  # the owner's choice stands
        print("ok")
    """)
    _runs_ok(code)
