"""What can refuse a turn; `gateway.py` and the adapters map each to an HTTP answer in the
client's own API error format (status in `status`)."""

from __future__ import annotations


class TurnRefused(Exception):
    status = 400
    kind = "invalid_request_error"


class SessionClosedError(TurnRefused):
    """The session was finished or dropped; a straggler's turn would belong to no sample."""

    status = 503
    kind = "overloaded_error"


class TurnCapError(TurnRefused):
    """The session used its turn budget (`--agent-max-turns`)."""

    status = 429
    kind = "rate_limit_error"


class ContextFullError(TurnRefused):
    """The prompt leaves no room to generate within the context budget (`--rollout-max-context-len`)."""

    status = 400
    kind = "invalid_request_error"
    code = "context_length_exceeded"


class BadRequestError(TurnRefused):
    """The request body is not one this API accepts."""


class FieldError(BadRequestError):
    """One field of the request body is malformed; `param` is its path (`messages[2].content`)."""

    def __init__(self, param: str, problem: str) -> None:
        super().__init__(f"{param}: {problem}")
        self.param = param


class EngineFailedError(TurnRefused):
    """The engines refused the turn or stayed unreachable past the retry budget."""

    status = 502
    kind = "api_error"


class EngineAbortedError(TurnRefused):
    """The engines aborted the turn (a weight update); the client's retry gets a fresh one."""

    status = 503
    kind = "overloaded_error"


class GatewayError(TurnRefused):
    """A failure of the gateway itself, answered with its reason instead of a bare 500."""

    status = 500
    kind = "api_error"
