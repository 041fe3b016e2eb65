"""`AnthropicAdapter`: slime's Anthropic Messages adapter (`/v1/messages`, `/v1/messages/count_tokens`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp import web

from slime.agent.adapters.common import BaseAdapter
from slime.agent.gateway.errors import BadRequestError, TurnRefused
from slime.agent.gateway.protocols import anthropic as protocol
from slime.agent.gateway.session import Session

# slime's names for the protocol functions
_translate_messages = protocol.translate_messages
_tools_to_chat_tools = protocol.tools_to_chat_tools
_fold_mid_list_system_into_user = protocol.fold_mid_list_system


def _request_session_id(request: Any) -> str:
    return protocol.session_key(request.headers) or "default"


class AnthropicAdapter(BaseAdapter):
    routes = {"/v1/messages": protocol}
    default_protocol = protocol

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.app.router.add_post("/v1/messages/count_tokens", self._count_tokens)

    async def _count_tokens(self, request: web.Request) -> web.Response:
        """The rendered prompt's length (the client uses it to decide when to compact)."""
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadRequestError("the request body must be a JSON object")
            req = protocol.parse_request(body, request.headers)
            req = dataclasses.replace(req, session_id=self.sessions.by_key(req.session_id).sid)
            ids = self.pipeline.prompt_ids(Session(req.session_id), req)
        except (ValueError, RecursionError) as e:
            return web.json_response(protocol.render_error(BadRequestError(f"the body is not JSON: {e}")), status=400)
        except TurnRefused as e:
            return web.json_response(protocol.render_error(e), status=e.status)
        return web.json_response({"input_tokens": len(ids)})
