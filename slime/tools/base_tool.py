"""The tool lifecycle (verl's contract): create -> execute* -> calc_reward -> release.

One tool object is built per process and shared by all trajectories; per-trajectory state
lives under `instance_id`. The rollout loop guarantees `release` is called for every
`create`, on every path (success, error, abort).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from slime.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


class BaseTool:
    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema):
        self.config = config or {}
        self.tool_schema = tool_schema
        self.name = tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **create_kwargs: Any) -> tuple[str, ToolResponse]:
        return instance_id or str(uuid4()), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **execute_kwargs: Any
                      ) -> tuple[ToolResponse, float, dict[str, Any]]:
        raise NotImplementedError(f"tool {self.name!r} does not implement execute")

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None
