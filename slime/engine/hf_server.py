"""SGLang-protocol HTTP server for the embedded CPU engine (Starlette + uvicorn over `HFBatcher`).

It speaks the subset of SGLang's HTTP API that slime, the sglang-router and our rollout code use,
with the same paths, bodies and response shapes, so the rest of the system cannot tell it from a
real SGLang engine. All model work happens in the batcher's decode thread; handlers only
validate, enqueue and await. `return_logprob` answers `meta_info.output_token_logprobs` and
`meta_info.input_token_logprobs` (`[logprob, token_id, null]` per token, SGLang's layout; input entries
from `logprob_start_len`, the first one null), so one engine can score another's samples (a teacher
for on-policy distillation: `max_new_tokens: 0`, `logprob_start_len: 0`); `top_logprobs_num: k` adds
`meta_info.output_top_logprobs` (the k most likely tokens per sampled position, SGLang's layout). `/get_load` returns one dict (num_running_reqs, num_waiting_reqs,
num_reqs, num_tokens, decode_steps_total, max_batch_size_seen, paused, weights_released,
weight_version, requests_restarted, weight_updates_total).

This module is the server's lifecycle (flags, uvicorn, shutdown); the app is `http_app.create_app`,
its handlers `generate_routes`, `status_routes`, `control_routes` and `weight_routes` (weight sync:
`/update_weights_from_*`, `/init_weights_update_group`, `/weights_checker`, ...), request bodies are parsed
by `request_parsing`. See decode_thread.py for why no answer mixes two weight versions.

    python -m slime.engine.hf_server --model-path DIR --host 127.0.0.1 --port 30000 \
        [--max-batch-size 32] [--num-threads K] [--weight-version V] [--dtype float32] [--log-level info]
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os

from slime.engine.batcher import HFBatcher, PreloadedModel
from slime.engine.http_app import Server, create_app
from slime.engine.request_parsing import BadRequest, parse_logprob_start_len, parse_sampling_params
from slime.engine.status_routes import BACKEND
from slime.engine.weight_routes import WeightSync
from slime.utils.http1_server import Http1Only
from slime.utils.gc_freeze import collection_paused
from slime.utils.startup_trace import mark

# the names this module served before the server was split by idea
__all__ = [
    "BACKEND",
    "BadRequest",
    "Server",
    "WeightSync",
    "create_app",
    "main",
    "parse_logprob_start_len",
    "parse_sampling_params",
]

logger = logging.getLogger(__name__)
_GRACEFUL_SHUTDOWN_SECONDS = 3


def main(argv: list[str] | None = None, preloaded: PreloadedModel | None = None) -> None:
    """`preloaded`: set when this engine was forked warm (slime.engine.warm_start); used if it is
    the checkpoint and dtype asked for."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument(
        "--num-threads", type=int, default=None, help="torch intra-op threads (default 1: robust when cores are shared)"
    )
    ap.add_argument("--weight-version", default="default")
    ap.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="bfloat16 roughly halves memory traffic on CPUs with avx512_bf16; float32 is exact",
    )
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)

    mark("engine: main" + (" (forked warm)" if preloaded is not None else ""))
    faulthandler.enable()  # a fatal signal (SIGSEGV, SIGABRT, ...) leaves every thread's traceback in the log
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch
    import uvicorn

    dtype = getattr(torch, args.dtype)
    warm = preloaded if preloaded is not None and preloaded.matches(args.model_path, dtype) else None
    # a cold load (transformers' model modules, the checkpoint) builds what the engine keeps: no collection
    # walks it while it loads nor after (slime.utils.gc_freeze); a warm one got the fork server's frozen
    with collection_paused():
        batcher = HFBatcher(
            args.model_path,
            max_batch_size=args.max_batch_size,
            num_threads=args.num_threads,
            weight_version=args.weight_version,
            dtype=dtype,
            preloaded=warm,
        )
        app = create_app(batcher, warm.server_tokenizer if warm else None)
    if warm is not None:
        logger.info("warm start: model and tokenizers preloaded by the fork server")
    mark("engine: model loaded")
    logger.info("serving %s on http://%s:%d", args.model_path, args.host, args.port)
    try:
        # Bounded graceful shutdown: a paused request would otherwise keep uvicorn waiting forever.
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level.lower(),
            timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_SECONDS,
            http=Http1Only,
        )
    finally:
        app.state.server.groups.destroy_all()
        batcher.shutdown()


if __name__ == "__main__":
    main()
