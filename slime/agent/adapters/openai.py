"""`OpenAIAdapter`: slime's OpenAI adapter (`/v1/chat/completions`), plus `/v1/responses`."""

from __future__ import annotations

from typing import Any

from slime.agent.adapters.common import BaseAdapter
from slime.agent.gateway.protocols import openai_chat as protocol
from slime.agent.gateway.protocols import openai_responses

_translate_messages = protocol.translate_messages


def _request_session_id(request: Any, body: dict) -> str:
    return protocol.request_session(request.headers, body)


class OpenAIAdapter(BaseAdapter):
    routes = {"/v1/chat/completions": protocol, "/v1/responses": openai_responses}
    default_protocol = protocol
