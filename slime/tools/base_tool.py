"""The tool lifecycle (verl's contract): create -> execute* -> calc_reward -> release.

One tool object is built per process and shared by all trajectories; per-trajectory state
lives under `instance_id`. The rollout loop guarantees `release` is called for every
`create`, on every path (success, error, abort).

Both of verl's calling conventions for `create` are part of the contract: older loops call
`create(instance_id, **create_kwargs)`, verl's current agent loop calls
`create(create_kwargs={...})` without an id. `create_kwargs_of` merges the two, so a tool reads
its per-sample arguments the same way whichever loop calls it. Classes written against verl's
own `BaseTool` (not this one) are run through `slime.tools.verl_compat.VerlToolAdapter`.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from slime.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from slime.tools.services import ToolServices


class ToolConfigError(ValueError):
    """A tool YAML that cannot be loaded; the message names file, entry and field."""


def create_kwargs_of(create_kwargs: dict[str, Any] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The per-sample create arguments, given either way (`create_kwargs=` wins on a clash)."""
    if create_kwargs is not None and not isinstance(create_kwargs, dict):
        raise TypeError(f"create_kwargs must be a mapping, got {type(create_kwargs).__name__}")
    return {**kwargs, **(create_kwargs or {})}


class BaseTool:
    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None):
        self.config = config or {}
        # verl: a class may define its own schema (the YAML then has no tool_schema)
        self.tool_schema = tool_schema if tool_schema is not None else self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__}: no tool_schema given and the class defines none")
        self.name = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema | None:
        return getattr(self, "tool_schema", None)

    @classmethod
    def start_shared_services(
        cls, name: str, config: dict[str, Any], services: ToolServices, handles: list[Any]
    ) -> None:
        """Start, once per run and in the RolloutManager, what every instance of this tool in the
        cluster shares (a sandbox, a global limiter); record it in `services`, and append what
        must stay referenced (and be `.stop()`ped at shutdown, when it has that method) to `handles`.
        Default: nothing."""

    def use_services(self, services: ToolServices) -> None:
        """Receive the run's shared services before the first call (default: none needed)."""

    def service_urls(self) -> dict[str, str]:
        """The remote services this tool calls, as {config field: URL}, so the start-up checks can
        refuse a run whose service is not there (`slime.tools.reachability`). Default: none."""
        return {}

    async def create(
        self, instance_id: str | None = None, *, create_kwargs: dict[str, Any] | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        create_kwargs_of(create_kwargs, kwargs)  # same argument checks as every tool
        return instance_id or str(uuid4()), ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **execute_kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        raise NotImplementedError(f"tool {self.name!r} does not implement execute")

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None
