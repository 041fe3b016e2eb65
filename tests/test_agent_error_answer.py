"""The gateway and slime's adapters answer a failed turn the same way (`error_answer`): a refusal with its own status
and kind in the client's API format, anything else a logged 500 that names the exception."""

from __future__ import annotations

import logging

import pytest

from slime.agent.gateway import errors
from slime.agent.gateway.protocols import anthropic, openai_chat, openai_responses

REFUSALS = [
    errors.SessionClosedError("finished"),
    errors.SessionKeyError("no such key"),
    errors.TurnCapError("cap"),
    errors.ContextFullError("too long"),
    errors.BadRequestError("not JSON"),
    errors.EngineFailedError("502"),
]


@pytest.mark.parametrize("protocol", [anthropic, openai_chat, openai_responses], ids=lambda p: p.__name__)
def test_a_refusal_keeps_its_status_and_anything_else_is_a_logged_500_naming_it(protocol, caplog):
    for refusal in REFUSALS:
        with caplog.at_level(logging.ERROR, logger=errors.__name__):
            assert errors.error_answer(protocol, refusal, "turn") == (refusal.status, protocol.render_error(refusal))
        assert caplog.records == []  # a refusal is the client's answer, not the server's fault

    try:
        raise KeyError("tool_calls")
    except KeyError as e:
        with caplog.at_level(logging.ERROR, logger=errors.__name__):
            status, body = errors.error_answer(protocol, e, "agent adapter: /v1/chat/completions")
    assert status == 500
    assert body == protocol.render_error(errors.GatewayError("KeyError: 'tool_calls'"))
    [logged] = caplog.records
    assert logged.getMessage() == "agent adapter: /v1/chat/completions failed" and logged.exc_info[0] is KeyError
