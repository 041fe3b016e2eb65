"""One gateway turn on the engines: sampling parameters, then `EngineClient.generate`.

The engine call goes through the project's `EngineClient` (in-flight bound, deadline, retry with a
fresh rid and abort of the old one, abort gate, progress), routed by the session id so a
consistent-hashing router keeps a session's prefix cache on one engine. A cancelled turn is aborted
where it was, as the client aborts any request it gives up: no engine keeps sampling tokens nobody
will read, and no other engine hears of it.
"""

from __future__ import annotations

from typing import Any

from slime.agent.gateway.errors import ContextFullError
from slime.agent.gateway.parsing import CALL_CLOSE
from slime.agent.gateway.records import ChatRequest, TurnRecord
from slime.agent.gateway.session import Session
from slime.rollout.engine_client import EngineClient

DEFAULT_MAX_NEW_TOKENS = 4096  # when neither the session nor the client caps it
# ids in, ids out: the engine must neither drop special tokens from nor trim stop strings off what it sampled
BASE_SAMPLING = {"skip_special_tokens": False, "spaces_between_special_tokens": False, "no_stop_trim": True}


def sampling_params(session: Session, request: ChatRequest, prompt_len: int) -> dict[str, Any]:
    """Session defaults, then the client's keys; `max_new_tokens` is the smallest of the session's,
    the client's and what the context budget leaves (`ContextFullError` when that is nothing)."""
    params = {**BASE_SAMPLING, "max_new_tokens": DEFAULT_MAX_NEW_TOKENS, **session.sampling_defaults}
    for key, value in request.sampling.items():
        params[key] = min(int(params["max_new_tokens"]), int(value)) if key == "max_new_tokens" else value
    if request.tools and not request.tool_choice.parallel:  # at most one call: the engine stops at its close
        params["stop"] = [*stop_list(params.get("stop")), CALL_CLOSE]
    if session.max_context_tokens > 0:
        room = session.max_context_tokens - prompt_len
        if room <= 0:
            raise ContextFullError(
                f"prompt is too long: {prompt_len} tokens >= the session's context budget of "
                f"{session.max_context_tokens} (--rollout-max-context-len)"
            )
        params["max_new_tokens"] = min(int(params["max_new_tokens"]), room)
    return params


def stop_list(stop: Any) -> list[str]:
    """A `stop` value (a string, a list of them, or None) as a list."""
    return [stop] if isinstance(stop, str) else list(stop or ())


def client_stops(request: ChatRequest) -> list[str]:
    """The stop strings the client asked for (the ones its API cuts from the text)."""
    return stop_list(request.sampling.get("stop"))


class EngineTurns:
    """Engine calls of one gateway. A cancelled turn (its client went away, its session finished) is
    aborted by `EngineClient.generate` before the cancellation completes: through the router, the
    closed connection is the abort and reaches only the engine that had the turn; sent to a known
    engine, that engine gets one `/abort_request`. Never one request per engine of the fleet."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client

    async def generate(
        self,
        prompt_ids: list[int],
        params: dict[str, Any],
        *,
        routing_key: str | None,
        top_logprobs_num: int = 0,
        images: tuple[Any, ...] = (),
    ) -> TurnRecord:
        """`images`: the prompt's `PreparedImage`s, in placeholder order (their data URIs as `image_data`)."""
        extra: dict[str, Any] = {"top_logprobs_num": top_logprobs_num} if top_logprobs_num else {}
        if images:
            extra["image_data"] = [image.data_uri for image in images]
        out = await self.client.generate(prompt_ids, params, routing_key=routing_key, **extra)
        matched = out.matched if out.finish_type == "stop" and isinstance(out.matched, str) else None  # not an id
        return TurnRecord(
            prompt_ids=prompt_ids,
            output_ids=out.token_ids,
            finish_reason=out.finish_type,
            output_log_probs=out.log_probs,
            weight_version=out.weight_version,
            stop_matched=matched,
            top_log_probs=out.top_log_probs,
            images=tuple(images),
        )
