"""One generation request inside the embedded engine, and how its answer crosses from the decode thread
to the HTTP server's event loop.

The decode thread owns the fields that change while the request runs. Answers go back only through
`loop.call_soon_threadsafe`: the final response dict on `future` and, for a streamed request, cumulative
response dicts on `stream` followed by None.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from slime.engine.sampling import SamplingParams


class EngineReleasedError(RuntimeError):
    """Raised for generation requests while the weights are released (the server answers 503)."""


@dataclass
class Request:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    stream: asyncio.Queue | None
    created: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    generator: torch.Generator | None = None
    stop_ids: frozenset[int] = frozenset()
    done: bool = False
    weight_version: str = ""  # the version the request's tokens come from (set when prefilled)
    logprob_start_len: int = 0  # first prompt position reported in input_token_logprobs (return_logprob only)
    input_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs_num: int = 0  # k most likely tokens kept per sampled position (return_logprob only)
    top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    images: dict[str, torch.Tensor] | None = None  # a VLM's pixel_values and image_grid_thw (image_data)
    position_delta: int = 0  # a VLM's M-RoPE offset: the token at index i sits at position i + delta (at prefill)

    def forget_output(self) -> None:
        """Back to the state before its prefill, to be recomputed from the prompt (new weights)."""
        self.output_ids, self.logprobs, self.input_logprobs, self.generator = [], [], [], None
        self.top_logprobs = []

    def send_partial(self, response: dict) -> None:
        """A streamed request's cumulative answer after one more token."""
        self.loop.call_soon_threadsafe(self.stream.put_nowait, response)

    def send_final(self, response: dict) -> None:
        self.done = True
        self.loop.call_soon_threadsafe(_resolve, self.future, response)
        if self.stream is not None:
            self.loop.call_soon_threadsafe(self.stream.put_nowait, response)
            self.loop.call_soon_threadsafe(self.stream.put_nowait, None)

    def send_error(self, exc: BaseException) -> None:
        self.done = True
        self.loop.call_soon_threadsafe(_reject, self.future, exc)
        if self.stream is not None:
            self.loop.call_soon_threadsafe(self.stream.put_nowait, None)


def resolve_threadsafe(fut: asyncio.Future, value: Any) -> None:
    """Complete a future of the event loop from the decode thread (ignored if it was cancelled)."""
    fut.get_loop().call_soon_threadsafe(_resolve, fut, value)


def reject_threadsafe(fut: asyncio.Future, exc: BaseException) -> None:
    fut.get_loop().call_soon_threadsafe(_reject, fut, exc)


def _resolve(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _reject(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
