"""What can refuse a turn; the gateway (`server.py`) and slime's adapters map each to an HTTP answer in the
client's own API error format (status in `status`, error type in `kind`), both by `error_answer`."""

from __future__ import annotations

import logging
import re
from typing import Any

logger = logging.getLogger(__name__)

# An engine's own words for a prompt over its context length: the embedded engine ("input_ids is too
# long: N tokens"), SGLang's tokenizer manager ("The input (N tokens) is longer than the model's context
# length (M tokens)"), SGLang's OpenAI server ("... exceeds the model's maximum context length ...")
_CONTEXT_REFUSAL = re.compile(r"too long|longer than the model's context length|maximum context length", re.IGNORECASE)


def is_context_refusal(body: str) -> bool:
    """Whether an engine's 400 body says the prompt does not fit its context."""
    return bool(_CONTEXT_REFUSAL.search(body))


class TurnRefused(Exception):
    """A refused turn; a subclass names its answer in its class line: ``(TurnRefused, status=503, kind=...)``."""

    status = 400
    kind = "invalid_request_error"

    def __init_subclass__(cls, status: int | None = None, kind: str | None = None, **kw: object) -> None:
        super().__init_subclass__(**kw)
        cls.status = cls.status if status is None else status
        cls.kind = cls.kind if kind is None else kind


class SessionClosedError(TurnRefused, status=503, kind="overloaded_error"):
    """The session was finished or dropped; a straggler's turn would belong to no sample."""


class SessionKeyError(TurnRefused, status=401, kind="authentication_error"):
    """The request holds no open session's key (none given, a wrong one, or a session never opened)."""

    code = "invalid_api_key"


class UnknownSessionError(TurnRefused, status=404, kind="not_found_error"):
    """A session id that was never opened (the host's call, not an agent's request)."""


class UnknownRouteError(TurnRefused, status=404, kind="not_found_error"):
    """A path the gateway does not serve."""


class TurnCapError(TurnRefused, status=429, kind="rate_limit_error"):
    """The session used its turn budget (`--agent-max-turns`)."""


class ContextFullError(TurnRefused):
    """The prompt leaves no room to generate within the context budget (`--rollout-max-context-len`)."""

    code = "context_length_exceeded"


class BadRequestError(TurnRefused):
    """The request body is not one this API accepts."""


class FieldError(BadRequestError):
    """One field of the request body is malformed; `param` is its path (`messages[2].content`)."""

    def __init__(self, param: str, problem: str) -> None:
        super().__init__(f"{param}: {problem}")
        self.param = param


class EngineFailedError(TurnRefused, status=502, kind="api_error"):
    """The engines refused the turn or stayed unreachable past the retry budget."""


class EngineAbortedError(TurnRefused, status=503, kind="overloaded_error"):
    """The engines aborted the turn (a weight update); the client's retry gets a fresh one."""


class GatewayError(TurnRefused, status=500, kind="api_error"):
    """A failure of the gateway itself, answered with its reason instead of a bare 500."""


def error_answer(protocol: Any, error: Exception, where: str) -> tuple[int, dict]:
    """`(status, body)` answering a turn that failed, in its API's error format (`protocol.render_error`): a
    refusal with its own status; anything else a 500 naming the exception (never a bare 500), logged with its
    traceback as `where` failed."""
    if isinstance(error, TurnRefused):
        return error.status, protocol.render_error(error)
    logger.error("%s failed", where, exc_info=error)
    return 500, protocol.render_error(GatewayError(f"{type(error).__name__}: {error}"))
