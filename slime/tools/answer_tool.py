"""`AnswerTool`: the shape of verl's answer-checking tools (`calc_gsm8k_reward`, `calc_geo3k_reward`).

The sample's ground truth arrives once per trajectory through `create_kwargs`; the model submits
answers with `execute` (each subclass grades them its own way and keeps the score in
`_state[instance_id]["reward"]`), and `calc_reward` hands that score back as the final tool reward.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from slime.tools.base_tool import BaseTool, create_kwargs_of
from slime.tools.schemas import ToolResponse


class AnswerTool(BaseTool):
    """config: `penalty` (step reward when a submission does not improve the score, default -0.05)."""

    def __init__(self, config: dict[str, Any], tool_schema):
        super().__init__(config, tool_schema)
        self.penalty = float(self.config.get("penalty", -0.05))
        self._state: dict[str, dict[str, Any]] = {}

    async def create(
        self,
        instance_id: str | None = None,
        ground_truth: Any = None,
        *,
        create_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ):
        """`create(iid, ground_truth=...)` or verl's `create(create_kwargs={"ground_truth": ...})`."""
        if ground_truth is None:
            ground_truth = create_kwargs_of(create_kwargs, kwargs).get("ground_truth")
        instance_id = instance_id or str(uuid4())
        self._state[instance_id] = {"ground_truth": ground_truth, "reward": 0.0, "answers": []}
        return instance_id, ToolResponse()

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return self._state[instance_id]["reward"]

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._state.pop(instance_id, None)
