"""A scripted engine that answers from what it is shown, behind the real router, with a small retriever
beside it: what the tests of slime's recipes and of upstream-style plugins run them against."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from slime.fleet.router import Router
from slime.testing.retriever import Retriever
from slime.testing.scripted_engine import ScriptedEngine

PASSAGES = ["Paris\nParis is the capital of France.", "Berlin\nBerlin is in Germany."]


@contextlib.contextmanager
def replying_stack(
    model_dir: str, reply: Callable[[str], str]
) -> Iterator[tuple[Router, ScriptedEngine, Retriever, Any]]:
    """(router, engine, retriever, tokenizer): the engine samples the tokens of `reply(prompt text)`, cut at
    the request's `max_new_tokens` (finish "length" then); a request by text (search-r1's) is shown as sent."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)

    def script(body: dict) -> dict:
        shown = body["text"] if "text" in body else tok.decode(body["input_ids"])
        out = tok(reply(shown), add_special_tokens=False)["input_ids"]
        cap = body["sampling_params"]["max_new_tokens"]
        return {
            "output_ids": out[:cap],
            "finish_type": "length" if cap < len(out) else "stop",
            "text": tok.decode(out[:cap]),
        }

    engine = ScriptedEngine(script, model_dir).start()
    router = Router().start()
    router.add_worker(engine.url)
    retriever = Retriever(PASSAGES).start()
    try:
        yield router, engine, retriever, tok
    finally:
        retriever.stop()
        router.stop()
        engine.stop()
