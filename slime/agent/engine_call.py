"""One gateway turn on the engines: sampling parameters, then `EngineClient.generate`.

The engine call goes through the project's `EngineClient` (in-flight bound, deadline, retry with a
fresh rid and abort of the old one, abort gate, progress), routed by the session id so a
consistent-hashing router keeps a session's prefix cache on one engine. A cancelled turn aborts
its rid on the engines, so no engine keeps sampling tokens nobody will read.
"""

from __future__ import annotations

import asyncio
from typing import Any

from slime.agent.errors import ContextFullError
from slime.agent.records import ChatRequest, TurnRecord
from slime.agent.session import Session
from slime.fleet import sglang_payloads as payloads
from slime.rollout.engine_client import EngineClient
from slime.utils.http_retry import RetryPolicy

DEFAULT_MAX_NEW_TOKENS = 4096  # when neither the session nor the client caps it
# ids in, ids out: the engine must neither drop special tokens from nor trim stop strings off what it sampled
BASE_SAMPLING = {"skip_special_tokens": False, "spaces_between_special_tokens": False, "no_stop_trim": True}


def sampling_params(session: Session, request: ChatRequest, prompt_len: int) -> dict[str, Any]:
    """Session defaults, then the client's keys; `max_new_tokens` is the smallest of the session's,
    the client's and what the context budget leaves (`ContextFullError` when that is nothing)."""
    params = {**BASE_SAMPLING, "max_new_tokens": DEFAULT_MAX_NEW_TOKENS, **session.sampling_defaults}
    for key, value in request.sampling.items():
        params[key] = min(int(params["max_new_tokens"]), int(value)) if key == "max_new_tokens" else value
    if session.max_context_tokens > 0:
        room = session.max_context_tokens - prompt_len
        if room <= 0:
            raise ContextFullError(f"prompt is too long: {prompt_len} tokens >= the session's context budget of "
                                   f"{session.max_context_tokens} (--rollout-max-context-len)")
        params["max_new_tokens"] = min(int(params["max_new_tokens"]), room)
    return params


class EngineTurns:
    """Engine calls of one gateway. A cancelled turn (its client went away, its session finished)
    aborts its rid before the cancellation completes, so whoever waits for the cancelled turn knows
    the engines are no longer working on it."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client

    async def generate(self, prompt_ids: list[int], params: dict[str, Any], *, routing_key: str | None) -> TurnRecord:
        rid = self.client.new_rid()
        try:
            out = await self.client.generate(prompt_ids, params, rid=rid, routing_key=routing_key)
        except asyncio.CancelledError:
            await self._abort(rid)  # one request per engine, 10 s at most
            raise
        return TurnRecord(prompt_ids=list(prompt_ids), output_ids=out.token_ids, finish_reason=out.finish_type,
                          output_log_probs=out.log_probs, weight_version=out.weight_version)

    async def _abort(self, rid: str) -> None:
        once = RetryPolicy(max_retries=0)
        await asyncio.gather(*(self.client.http.post(f"{u}/abort_request", payloads.abort_request(rid=rid),
                                                     timeout=10, policy=once)
                               for u in self.client.endpoints.engine_urls), return_exceptions=True)
