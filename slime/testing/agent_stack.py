"""A scripted agent stack for tests and benchmarks: scripted engines behind the real
sglang-router, an `EngineClient`, and a started agent `Gateway` in front of them.

The engines answer from `replies(case, turn) -> text`: the case is the `case=<name>` tag in the
prompt, the turn the number of assistant turns already in it. The answer is that text's ids plus
`<|im_end|>`, with log-probs distinct per turn and position (`log_probs`), so a test can rebuild
exactly what was sampled for any request the engines recorded (`answer`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from slime.agent.gateway.server import Gateway, GatewayConfig
from slime.fleet.router import Router
from slime.rollout.engine_client import EngineClient
from slime.testing.scripted_engine import ScriptedEngine
from slime.utils.endpoints import Endpoints
from slime.utils.types import Sample

CASE = re.compile(r"case=([\w.-]+)")
IM_END = "<|im_end|>"


def log_probs(turn: int, n: int) -> list[float]:
    return [round(-0.01 * (turn + 1) - 0.001 * i, 6) for i in range(n)]


class RecordingClient(EngineClient):
    """The project's client, keeping each (prompt ids, `EngineOutput`) it got from the engines, so a
    test on a real engine can check a trajectory against what was sampled."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answers: list = []
        self.image_data: list = []  # each request's `image_data` (None without images), in the same order

    async def generate(self, input_ids, sampling_params, **kwargs):
        out = await super().generate(input_ids, sampling_params, **kwargs)
        self.answers.append((list(input_ids), out))
        self.image_data.append(kwargs.get("image_data"))
        return out


class AgentStack:
    def __init__(
        self,
        tokenizer: Any,
        model_dir: str | Path,
        replies: Callable[[str, int], str],
        *,
        engines: int = 1,
        config: GatewayConfig | None = None,
        log_dir: str | None = None,
        engine_urls: list[str] | None = None,
    ) -> None:
        """`engine_urls`: engines already serving this stack's `answer` elsewhere (another process's
        `start_engines`, as real engines are processes of their own); None starts `engines` here."""
        self.tok, self.model_dir, self.replies = tokenizer, str(model_dir), replies
        self.end_id = tokenizer.convert_tokens_to_ids(IM_END)
        self.config, self.log_dir, self.engine_urls = config, log_dir, engine_urls
        self.n_engines = len(engine_urls) if engine_urls is not None else engines
        self.engines: list[ScriptedEngine] = []
        self.router: Router | None = None
        self.client: EngineClient | None = None
        self.gateway: Gateway | None = None

    @classmethod
    def started_on_tiny_qwen(cls, replies: Callable[[str, int], str], **kwargs: Any) -> AgentStack:
        """A started stack on the tests' tiny Qwen tokenizer (the chat template the gateway renders)."""
        from transformers import AutoTokenizer

        from slime.testing.tiny_model import qwen_tokenizer_dir

        return cls(
            AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir())), qwen_tokenizer_dir(), replies, **kwargs
        ).start()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """What the engines sample for this request body (a pure function of its input ids)."""
        text = self.tok.decode(body["input_ids"], skip_special_tokens=False)
        case = CASE.search(text)
        turn = text.count("<|im_start|>assistant") - 1
        ids = self.tok.encode(self.replies(case.group(1) if case else "", turn), add_special_tokens=False)
        ids.append(self.end_id)
        limit = int(body["sampling_params"].get("max_new_tokens", len(ids)))
        finish = "length" if len(ids) > limit else "stop"
        ids = ids[:limit]
        return {"output_ids": ids, "finish_type": finish, "log_probs": log_probs(turn, len(ids))}

    def text(self, ids: list[int]) -> str:
        """The `text` of an answer, as SGLang sends it: the sampled ids decoded, the stop token trimmed."""
        return self.tok.decode(ids[:-1] if ids[-1:] == [self.end_id] else ids, skip_special_tokens=False)

    def start_engines(self) -> list[str]:
        """Start this stack's scripted engines in this process; their URLs."""
        self.engines = [
            ScriptedEngine(self.answer, self.model_dir, decode=self.text).start() for _ in range(self.n_engines)
        ]
        return [e.url for e in self.engines]

    def start(self) -> AgentStack:
        urls = self.engine_urls if self.engine_urls is not None else self.start_engines()
        self.router = Router(log_dir=self.log_dir).start()
        for url in urls:
            self.router.add_worker(url)
        self.client = EngineClient(
            Endpoints(self.router.url, list(urls)),
            tokenizer=self.tok,
            request_timeout=30.0,
            max_retries=2,
        )
        self.gateway = Gateway(self.client, tokenizer=self.tok, config=self.config).start()
        return self

    @property
    def requests(self) -> list[dict[str, Any]]:
        return [r for e in self.engines for r in e.requests]

    def requests_of(self, case: str) -> list[dict[str, Any]]:
        """The /generate bodies of one case, in the order the engines got them."""
        tag = f"case={case}"
        return [r for r in self.requests if tag in self.tok.decode(r["input_ids"], skip_special_tokens=False)]

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        if self.router is not None:
            self.router.stop()
        for e in self.engines:
            e.stop()


def assert_chain(sample: Sample, turns: list[tuple[list[int], list[int], list[float]]]) -> None:
    """`sample` is the last prompt plus its answer; each turn's sampled ids sit at their position
    with mask 1 and their log-probs, everything else (template, tool, user deltas) mask 0."""
    tokens = list(turns[-1][0]) + list(turns[-1][1])
    mask, lps = [0] * len(tokens), [0.0] * len(tokens)
    for prompt, ids, log_probs in turns:
        start = len(prompt)
        assert tokens[start : start + len(ids)] == list(ids), "a later prompt re-tokenised what the model sampled"
        mask[start : start + len(ids)] = [1] * len(ids)
        lps[start : start + len(ids)] = log_probs
    p = len(turns[0][0])
    assert sample.tokens == tokens
    assert sample.response_length == len(tokens) - p
    assert sample.loss_mask == mask[p:]
    assert sample.rollout_log_probs == lps[p:]
