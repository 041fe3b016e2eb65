"""Pydantic models for OpenAI function tools and tool responses.

Parameters keep the *whole* JSON Schema: unknown keywords (`items`, nested `properties`,
`enum`, `default`, `minimum`, `anyOf`, ...) are preserved (`extra="allow"`), so what the model
is shown and what arguments are validated against is exactly what the config says.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class OpenAIFunctionPropertySchema(BaseModel):
    """One JSON Schema node; extra keywords are kept as-is."""

    model_config = ConfigDict(extra="allow")
    type: str | list[str] | None = None
    description: str | None = None
    enum: list[Any] | None = None


class OpenAIFunctionParametersSchema(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["object"] = "object"
    properties: dict[str, OpenAIFunctionPropertySchema] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)


class OpenAIFunctionSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    description: str = ""
    parameters: OpenAIFunctionParametersSchema = Field(default_factory=OpenAIFunctionParametersSchema)
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """`{"type": "function", "function": {...}}` as in the OpenAI tools API and verl's YAML."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function"] = "function"
    function: OpenAIFunctionSchema

    def to_openai(self) -> dict[str, Any]:
        """Plain dict for chat templates, without None-valued keys the config never had."""
        return self.model_dump(exclude_none=True)


class ToolResponse(BaseModel):
    """What a tool hands back to the model; text only is rendered for text models."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None
