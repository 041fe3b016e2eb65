"""`Progress`: live counters of the rollout or eval that is running, owned by the controller.

The engine client feeds responses and tokens as requests finish (so any rollout function reports
progress); the default rollout also counts finished samples. `status()` reads `as_dict()` from
another thread while a rollout runs: plain integer updates, no lock needed for a progress bar.
"""

from __future__ import annotations

import time
from typing import Any


class Progress:
    def __init__(self) -> None:
        self.phase = "idle"
        self.reset(0)

    def reset(self, target: int, phase: str = "rollout") -> None:
        self.target, self.samples_done, self.responses, self.tokens = target, 0, 0, 0
        self.started = time.monotonic()
        self.phase = phase if target > 0 else self.phase

    def finish(self) -> None:
        self.phase = "idle"

    def on_response(self, tokens: int) -> None:
        self.responses += 1
        self.tokens += tokens

    def on_samples(self, n: int) -> None:
        self.samples_done += n

    def as_dict(self) -> dict[str, Any]:
        elapsed = max(1e-9, time.monotonic() - self.started)
        return {
            "phase": self.phase,
            "target": self.target,
            # custom rollouts may not count samples: fall back to finished engine responses
            "done": self.samples_done or min(self.responses, self.target or self.responses),
            "responses": self.responses,
            "tokens": self.tokens,
            "tokens_per_s": self.tokens / elapsed,
        }
