"""A scripted engine with finite capacity: a long-tail workload paced in simulated decode time.

For the asynchronous-rollout benchmark and its test. `PacedScript` is an abort-aware script for
`slime.testing.scripted_engine` (`ScriptedEngine` / `build_app`): each engine decodes at most
`slots` requests at once (the rest wait, first come first served), each at `tokens_per_s`, so
engine capacity is finite and idle slots are visible. It measures, inside the engine, the
time-weighted fraction of slots that are decoding (`busy_fraction`) and every token it generated.

Responses are deterministic and continuable, like sampling with a fixed seed:
  - A fresh sample (no response ids in its input) draws its total length `L` from a seeded
    heavy-tailed distribution (`LongTail`: most responses short, a few up to `long_max_factor`
    times longer), so the samples of one group differ as real samples do.
  - Its first response token encodes `L` (`LENGTH_BASE + L`); the others are a pure function of
    the prompt and the position (`response_ids(prompt, L)`). Prompt ids must be below `BODY_BASE`.
  - A continuation (input = prompt + partial response, as partial rollout sends it) reads `L`
    back from the first response token and generates only the remaining tokens, so a sample
    aborted after k tokens and continued ends with exactly the ids of an uninterrupted one.
An abort answers at once with the tokens decoded so far (`finish_type` "abort"), as SGLang does;
a request aborted while it waits for a slot answers with none. No polling: slots are handed over
with futures, and a decoding request sleeps until it is done or its abort event fires.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

BODY_BASE = 120_000  # response ids after the first: BODY_BASE .. BODY_BASE + BODY_SPAN - 1
BODY_SPAN = 20_000
LENGTH_BASE = BODY_BASE + BODY_SPAN  # first response id = LENGTH_BASE + total length


@dataclass(frozen=True)
class LongTail:
    """Response lengths of reasoning RL: `1 - long_fraction` short ones, uniform in
    [short_len/2, short_len]; the rest long, log-uniform in [2, long_max_factor] x short_len."""

    short_len: int = 32
    long_fraction: float = 0.2
    long_max_factor: float = 16.0

    def __post_init__(self):
        if self.short_len < 2:
            raise ValueError(f"LongTail.short_len must be >= 2, got {self.short_len}")
        if not 0.0 <= self.long_fraction <= 1.0:
            raise ValueError(f"LongTail.long_fraction must be in [0, 1], got {self.long_fraction}")
        if self.long_max_factor < 2.0:
            raise ValueError(f"LongTail.long_max_factor must be >= 2, got {self.long_max_factor}")

    @property
    def max_len(self) -> int:
        return int(round(self.short_len * self.long_max_factor))

    def draw(self, rng: random.Random) -> int:
        if rng.random() >= self.long_fraction:
            return rng.randint(self.short_len // 2, self.short_len)
        factor = math.exp(rng.uniform(math.log(2.0), math.log(self.long_max_factor)))
        return min(self.max_len, max(2 * self.short_len, int(round(self.short_len * factor))))

    def mean(self) -> float:
        """The expected length (for sizing a benchmark from capacity)."""
        short = (self.short_len // 2 + self.short_len) / 2
        lo, hi = math.log(2.0), math.log(self.long_max_factor)
        long = self.short_len * (self.long_max_factor - 2.0) / (hi - lo)  # E[exp(U(lo, hi))] x short_len
        return (1 - self.long_fraction) * short + self.long_fraction * long


def _body_id(prompt: list[int], position: int) -> int:
    digest = hashlib.blake2b(f"{prompt[-8:]}:{len(prompt)}:{position}".encode(), digest_size=4).digest()
    return BODY_BASE + int.from_bytes(digest, "little") % BODY_SPAN


def response_ids(prompt: list[int], length: int) -> list[int]:
    """The whole response of a sample of `length` tokens to `prompt` (what any run of it yields)."""
    if length <= 0:
        return []
    return [LENGTH_BASE + length] + [_body_id(prompt, i) for i in range(1, length)]


def split_input(input_ids: list[int]) -> tuple[list[int], list[int]]:
    """(prompt, partial response): the response starts at its length-encoding first id."""
    for i, t in enumerate(input_ids):
        if t >= LENGTH_BASE:
            return list(input_ids[:i]), list(input_ids[i:])
        if t >= BODY_BASE:
            raise ValueError(
                f"paced engine: input id {t} at position {i} is a response id with no response "
                f"start before it; prompt ids must be below {BODY_BASE}"
            )
    return list(input_ids), []


def total_length(response: list[int]) -> int:
    """The length an uninterrupted run of this (partial) response has."""
    if not response or response[0] < LENGTH_BASE:
        raise ValueError("not a paced-engine response (its first id does not encode a length)")
    return response[0] - LENGTH_BASE


class _Slots:
    """`n` decode slots, handed to waiters in arrival order; tracks occupancy over time."""

    def __init__(self, n: int):
        self.n, self.used = n, 0
        self.waiters: collections.deque[asyncio.Future] = collections.deque()

    async def acquire(self, aborted: asyncio.Event) -> bool:
        """True with a slot held; False if `aborted` fired first (no slot taken)."""
        if self.used < self.n and not self.waiters:
            self.used += 1
            return True
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        stop = asyncio.ensure_future(aborted.wait())
        try:
            await asyncio.wait({fut, stop}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._give_up(fut)
            raise
        finally:
            stop.cancel()
        if fut.done():
            return True  # handed over by release(): used already counts it
        self._give_up(fut)
        return False

    def _give_up(self, fut: asyncio.Future) -> None:
        """Leave the queue; a slot handed over meanwhile goes to the next waiter."""
        if fut.done() and not fut.cancelled():
            self.release()
            return
        fut.cancel()
        if fut in self.waiters:
            self.waiters.remove(fut)

    def release(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes straight to the next waiter
                return
        self.used -= 1


class PacedScript:
    """One engine's decode loop (use one instance per engine). Abort-aware: `script(body, aborted)`.

    Counters are read from other threads (the benchmark), so they sit behind a lock.
    """

    def __init__(self, lengths: LongTail, *, slots: int, tokens_per_s: float, seed: int = 0):
        if slots < 1 or tokens_per_s <= 0:
            raise ValueError(f"PacedScript needs slots >= 1 and tokens_per_s > 0, got {slots}, {tokens_per_s}")
        self.lengths = lengths
        self.token_time = 1.0 / tokens_per_s
        self.rng = random.Random(seed)
        self.n_slots = slots
        self._slots: _Slots | None = None  # created on the engine's own loop
        self._lock = threading.Lock()
        self._busy_integral = 0.0  # slot-seconds spent decoding since the window started
        self._busy_now = 0
        self.peak_decoding = 0  # most requests ever decoding at once (never above `slots`)
        self._since = self._window_start = time.monotonic()
        self.generated_tokens = 0  # every token answered, aborted answers included
        self.aborted_tokens = 0  # tokens answered with finish_type "abort"
        self.requests = self.aborts = self.continuations = 0

    # --- occupancy accounting ---
    def _advance(self, now: float) -> None:
        self._busy_integral += self._busy_now * (now - self._since)
        self._since = now

    def _occupy(self, delta: int) -> None:
        with self._lock:
            self._advance(time.monotonic())
            self._busy_now += delta
            self.peak_decoding = max(self.peak_decoding, self._busy_now)

    def reset_window(self) -> None:
        """Start a new measurement window for `busy_fraction` (counters are kept)."""
        with self._lock:
            now = time.monotonic()
            self._advance(now)
            self._busy_integral, self._window_start = 0.0, now

    def busy_slot_seconds(self) -> float:
        with self._lock:
            self._advance(time.monotonic())
            return self._busy_integral

    def busy_fraction(self) -> float:
        """Time-weighted fraction of decode slots occupied since the window started."""
        with self._lock:
            now = time.monotonic()
            self._advance(now)
            span = now - self._window_start
            return self._busy_integral / (self.n_slots * span) if span > 0 else 0.0

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            self._advance(time.monotonic())
            return {
                "busy_slot_seconds": self._busy_integral,
                "decoding": self._busy_now,
                "generated_tokens": self.generated_tokens,
                "aborted_tokens": self.aborted_tokens,
                "requests": self.requests,
                "aborts": self.aborts,
                "continuations": self.continuations,
            }

    # --- the script ---
    async def __call__(self, body: dict[str, Any], aborted: asyncio.Event) -> dict[str, Any]:
        prompt, partial = split_input(list(body.get("input_ids") or []))
        length = total_length(partial) if partial else self.lengths.draw(self.rng)
        budget = int((body.get("sampling_params") or {}).get("max_new_tokens", length))
        remaining = length - len(partial)
        n = max(0, min(remaining, budget))
        out = response_ids(prompt, length)[len(partial) : len(partial) + n]
        finish = "stop" if n >= remaining else "length"
        with self._lock:
            self.requests += 1
            self.continuations += bool(partial)
        if self._slots is None:
            self._slots = _Slots(self.n_slots)
        if n and not await self._slots.acquire(aborted):
            return self._answer([], "abort")
        if not n:
            return self._answer(out, finish)
        self._occupy(+1)
        start = time.monotonic()
        try:
            try:
                await asyncio.wait_for(aborted.wait(), timeout=n * self.token_time)
                done = min(n, int((time.monotonic() - start) / self.token_time))
                return self._answer(out[:done], "abort")
            except asyncio.TimeoutError:
                return self._answer(out, finish)
        finally:
            self._occupy(-1)
            self._slots.release()

    def _answer(self, ids: list[int], finish: str) -> dict[str, Any]:
        with self._lock:
            self.generated_tokens += len(ids)
            if finish == "abort":
                self.aborts += 1
                self.aborted_tokens += len(ids)
        return {"output_ids": ids, "finish_type": finish, "text": ""}
