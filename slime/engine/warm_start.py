"""Warm engine starts: what the per-node fork server (slime.utils.fork_server) loads once, and how a
forked child becomes an embedded engine.

`preload` imports everything an engine needs (torch, transformers, Starlette, uvicorn and its
event-loop and HTTP modules) and loads the checkpoint and both tokenizers; `serve` runs
`slime.engine.hf_server.main` in the forked child with that state. An engine asked for another
checkpoint or dtype loads its own, exactly as a cold start would.

The server must stay single-threaded to fork safely, so the preload runs torch with one thread
(no OpenMP pool exists when it forks; each engine sets its own `--num-threads`) and without the
progress bar (tqdm's monitor thread).
"""

from __future__ import annotations

import importlib
from typing import Any

# the off switch (a tuning knob, read by slime.ray.session): `SLIME_ENGINE_FORK_SERVER=0` starts every engine
# cold. The server's socket itself reaches the engines as an argument (Fleet -> EngineActor -> hf_server).
FORK_SERVER_ENV = "SLIME_ENGINE_FORK_SERVER"
# imported here so each engine does not: uvicorn picks these at run time
_SERVING_MODULES = (
    "starlette.applications",
    "starlette.routing",
    "uvicorn",
    "uvicorn.loops.auto",
    "uvicorn.loops.uvloop",
    "uvicorn.loops.asyncio",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.websockets.auto",
    "uvicorn.lifespan.on",
    "slime.engine.hf_server",
)


def preload(model_path: str, dtype: str = "float32") -> Any:
    """A `PreloadedModel` of `model_path` (the fork server's state for every engine it forks)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(1)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    for name in _SERVING_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # optional speedups (uvloop, httptools) may be missing
            pass
    from slime.engine.model_loading import PreloadedModel, load_model
    from slime.utils.processing_utils import load_tokenizer

    torch_dtype = getattr(torch, dtype)
    return PreloadedModel(
        model_path=str(model_path),
        dtype=torch_dtype,
        model=load_model(str(model_path), torch_dtype),
        tokenizer=load_tokenizer(str(model_path)),
        server_tokenizer=load_tokenizer(str(model_path)),
    )


def serve(argv: list[str], preloaded: Any) -> None:
    """The forked child's entry point: `python -m slime.engine.hf_server ARGV`, warm."""
    from slime.engine.hf_server import main

    main(argv, preloaded)
