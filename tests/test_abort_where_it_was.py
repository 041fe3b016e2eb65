"""Issue 20, item 9: a request abandoned without an answer is aborted on the engine that had it and
nowhere else, through the real sglang-router (which names no worker): our deadline closes the
connection, the router closes its own to that engine, and the engine aborts the request."""

from __future__ import annotations

import asyncio
import threading

from slime.rollout.engine_client import EngineClient
from slime.utils.endpoints import Endpoints

GOOD = [7, 8, 9]


class HangTheFirst:
    """Shared by every engine: the first request anywhere hangs until it is aborted (and says so);
    every other one answers GOOD at once."""

    def __init__(self):
        self.hung: list[str] = []
        self.aborted = threading.Event()

    async def __call__(self, body, aborted: asyncio.Event):
        if self.hung:
            return {"output_ids": GOOD, "finish_type": "stop", "text": "7 8 9"}
        self.hung.append(body["rid"])
        await aborted.wait()
        self.aborted.set()
        return {"output_ids": [], "finish_type": "abort", "text": ""}


def test_a_timed_out_request_is_aborted_only_by_the_engine_that_had_it(fleet_of):
    script = HangTheFirst()
    router, engines = fleet_of(script, 3)
    client = EngineClient(Endpoints(router.url, [e.url for e in engines]), request_timeout=1.0, vocab_size=64)
    client.retry_policy.base_delay = client.retry_policy.max_delay = 0.0

    async def go():
        try:
            return await client.generate([1, 2, 3], {"max_new_tokens": 4}, rid="abandoned")
        finally:
            await client.close()

    out = asyncio.run(go())
    assert out.token_ids == GOOD and script.hung == ["abandoned"]
    assert script.aborted.wait(30), "the engine never learnt that its client went away"
    assert sorted(len(e.disconnects) for e in engines) == [0, 0, 1]  # one engine had it, and aborted it
    assert [d for e in engines for d in e.disconnects] == ["abandoned"]
    assert [e.aborts for e in engines] == [[], [], []]  # no /abort_request to any engine
    assert (client.disconnect_aborts, client.abort_stats.requests) == (1, 0)
    assert client.stats.retries == {"timeout": 1}
    workers = router.list_workers()  # the real router's /workers answer passes the check
    assert sorted(w.url for w in workers) == sorted(e.url for e in engines) and all(w.healthy for w in workers)
    assert not router.bad_answers
    retried = [b["rid"] for e in engines for b in e.requests if b["rid"] != "abandoned"]
    assert len(retried) == 1 and retried[0].startswith("slime-")  # the retry went out with a fresh rid
