"""The `Sample`: one trajectory, from prompt to reward, in slime's field layout.

Plugins written for slime import it as `from slime.utils.types import Sample`; the fields,
`Status` values and `to_dict`/`from_dict` round trip match slime's so dumps and plugins move
between the two unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass
class Sample:
    """One prompt/response pair. `tokens` = prompt ids + response ids; per-response-token lists
    (`loss_mask`, `rollout_log_probs`) have length `response_length`."""

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    status: "Sample.Status" = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    weight_versions: list[str] = field(default_factory=list)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of builtins (status as its string), safe for `torch.load(weights_only=True)`."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Sample":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"Sample.from_dict: unknown field(s) {sorted(unknown)}")
        data = dict(data)
        status = data.get("status", cls.Status.PENDING)
        data["status"] = status if isinstance(status, cls.Status) else cls.Status(status)
        return cls(**data)

    def get_reward_value(self, args: Any = None) -> float:
        """The scalar reward; dict rewards are read at `--reward-key` (default "score")."""
        if isinstance(self.reward, dict):
            key = getattr(args, "reward_key", None) or "score"
            if key not in self.reward:
                raise KeyError(f"sample {self.index}: reward dict has no key {key!r} (set --reward-key)")
            return float(self.reward[key])
        return float(self.reward if self.reward is not None else 0.0)
