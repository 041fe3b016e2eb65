"""Pydantic models for OpenAI function tools and tool responses (verl's `verl.tools.schemas` names).

A tool written for verl runs here after changing only `verl.tools` to `slime.tools` in its imports:
every public name of verl's module exists with the same fields and methods.

Parameters keep the *whole* JSON Schema: unknown keywords (`items`, nested `properties`,
`enum`, `default`, `minimum`, `anyOf`, ...) are preserved (`extra="allow"`), so what the model
is shown and what arguments are validated against is exactly what the config says.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


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
        """Plain dict for chat templates, without None-valued keys the config never had, and without
        `strict` unless the config set it: verl renders its schemas with `exclude_unset`, so a verl
        YAML's tools reach the prompt (and its tokens) exactly as verl shows them."""
        out = self.model_dump(exclude_none=True)
        if "strict" not in self.function.model_fields_set:
            del out["function"]["strict"]
        return out


class OpenAIFunctionParsedSchema(BaseModel):
    """A tool call as parsed from model output: arguments still a JSON string."""

    name: str
    arguments: str


class OpenAIFunctionCallSchema(BaseModel):
    """A tool call with decoded arguments."""

    name: str
    arguments: dict[str, Any]

    @staticmethod
    def from_openai_function_parsed_schema(
        parsed_schema: OpenAIFunctionParsedSchema,
    ) -> tuple["OpenAIFunctionCallSchema", bool]:
        """(call, has_decode_error): arguments that are not a JSON object become {} and flag the error."""
        try:
            arguments = json.loads(parsed_schema.arguments)
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            return OpenAIFunctionCallSchema(name=parsed_schema.name, arguments={}), True
        return OpenAIFunctionCallSchema(name=parsed_schema.name, arguments=arguments), False


class OpenAIFunctionToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: OpenAIFunctionCallSchema


class ToolResponse(BaseModel):
    """What a tool hands back to the model; text only is rendered for text models.

    `image`/`video` must be lists (one item is `[img]`), as in verl: a bare item is refused here,
    where the tool's author can see it, rather than mis-rendered later.
    """

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _media_are_lists(cls, values: Any) -> Any:
        if isinstance(values, dict):
            for key in ("image", "video"):
                if values.get(key) is not None and not isinstance(values[key], list):
                    raise ValueError(
                        f"ToolResponse.{key} must be a list (wrap one item as [{key}]), "
                        f"got {type(values[key]).__name__}"
                    )
        return values

    def is_empty(self) -> bool:
        return not self.text and not self.image and not self.video

    def is_text_only(self) -> bool:
        return bool(self.text) and not self.image and not self.video
