"""`EngineClient`: token-in/token-out `/generate`, in-flight bound, fresh rid on retry, progress."""

from __future__ import annotations

import asyncio
import os

import pytest
from aiohttp import web

from slime.rollout.engine_answer import BadAnswer
from slime.rollout.engine_client import EngineClient, parse_generate_response
from slime.testing.until import until_async
from slime.utils.http_retry import HttpError
from slime.testing.local_http import serve_app
from slime.utils.endpoints import Endpoints


class Engine:
    """A local SGLang-shaped server: /generate echoes the last ids with fixed log-probs; the first
    `fail` answers are 503, the first `hang` requests wait for `released`; /abort_request records
    what was aborted."""

    def __init__(self, fail: int = 0, gate: asyncio.Event | None = None, hang: int = 0):
        self.fail, self.gate, self.hang = fail, gate, hang
        self.released = asyncio.Event()
        self.abort_answer: web.Response | None = None
        self.generated, self.aborted, self.waiting = [], [], 0
        self.abort_received = asyncio.Event()

    async def generate(self, request):
        body = await request.json()
        self.generated.append(body)
        if self.fail:
            self.fail -= 1
            return web.Response(status=503, text="restarting")
        if self.hang:
            self.hang -= 1
            await self.released.wait()
        if self.gate is not None:
            self.waiting += 1
            await self.gate.wait()
        ids = body["input_ids"][-2:]
        return web.json_response(
            {
                "text": "t",
                "meta_info": {
                    "output_token_logprobs": [[-0.5 * (i + 1), t, None] for i, t in enumerate(ids)],
                    "finish_reason": {"type": "length"},
                    "weight_version": "3",
                },
            }
        )

    async def abort(self, request):
        self.aborted.append(await request.json())
        self.abort_received.set()
        if self.abort_answer is not None:
            return self.abort_answer
        return web.json_response({})

    async def __aenter__(self):
        self._serving = serve_app({"/generate": self.generate, "/abort_request": self.abort})
        self.url = await self._serving.__aenter__()
        return self

    async def __aexit__(self, *exc):
        await self._serving.__aexit__(*exc)


async def test_generate_returns_sampled_ids_and_feeds_progress():
    async with Engine() as eng:
        client = EngineClient(Endpoints(eng.url, [eng.url]))
        out = await client.generate([5, 6, 7], {"max_new_tokens": 2})
        await client.close()
    assert (out.token_ids, out.log_probs, out.finish_type, out.weight_version) == ([6, 7], [-0.5, -1.0], "length", "3")
    sent = eng.generated[0]
    assert sent["input_ids"] == [5, 6, 7] and sent["return_logprob"] is True
    assert sent["rid"] == f"slime-{os.getpid()}-0"
    assert (client.progress.responses, client.progress.tokens, client.stats.requests) == (1, 2, 1)


async def test_a_retry_after_an_answer_gets_a_fresh_rid_and_aborts_nothing():
    async with Engine(fail=1) as eng, Engine() as other:
        client = EngineClient(Endpoints(eng.url, [eng.url, other.url]))
        client.retry_policy.base_delay = client.retry_policy.max_delay = 0.0
        out = await client.generate([1, 2], {}, rid="mine")
        assert not client._background  # the 503 was an answer: no engine still runs "mine"
        await client.close()
    assert out.token_ids == [1, 2]
    assert [b["rid"] for b in eng.generated] == ["mine", f"slime-{os.getpid()}-0"]
    assert (eng.aborted, other.aborted) == ([], [])
    assert client.stats.retries == {"http_503": 1}


async def test_a_retry_after_no_answer_aborts_the_old_rid_only_on_the_engine_that_had_it():
    async with Engine(hang=1) as eng, Engine() as other:
        client = EngineClient(Endpoints(eng.url, [eng.url, other.url]), request_timeout=0.5)
        client.retry_policy.base_delay = client.retry_policy.max_delay = 0.0
        out = await client.generate([1, 2], {}, rid="mine")
        await asyncio.gather(*client._background)  # the abort of the abandoned rid
        eng.released.set()
        await client.close()
    assert out.token_ids == [1, 2]
    assert [b["rid"] for b in eng.generated] == ["mine", f"slime-{os.getpid()}-0"]
    assert (eng.aborted, other.aborted) == ([{"rid": "mine"}], [])
    assert client.stats.retries == {"timeout": 1} and client.abort_stats.as_dict() == {
        "requests": 1,
        "retries": 0,
        "failures": 0,
    }
    assert client.disconnect_aborts == 0  # sent to a known engine: aborted there, by request


async def test_a_direct_call_without_an_answer_aborts_on_that_engine():
    async with Engine(hang=1) as eng, Engine() as other:
        client = EngineClient(Endpoints(other.url, [other.url]), request_timeout=0.5)
        client.retry_policy.base_delay = client.retry_policy.max_delay = 0.0
        out = await client.generate([1, 2], {}, rid="direct", url=f"{eng.url}/generate")
        await asyncio.gather(*client._background)
        eng.released.set()
        await client.close()
    assert out.token_ids == [1, 2] and [b["rid"] for b in eng.generated][0] == "direct"
    assert (eng.aborted, other.aborted, other.generated) == ([{"rid": "direct"}], [], [])


async def test_in_flight_bound_holds_requests_back():
    gate = asyncio.Event()
    async with Engine(gate=gate) as eng:
        client = EngineClient(Endpoints(eng.url, []), concurrency=2)
        assert client.semaphore is client.semaphore
        tasks = [asyncio.ensure_future(client.generate([i, i], {})) for i in range(5)]
        await asyncio.wait_for(until_async(lambda: eng.waiting == 2, interval=0), 60)
        assert (client.in_flight, len(eng.generated)) == (2, 2)
        gate.set()
        outs = await asyncio.gather(*tasks)
        await client.close()
    assert [o.token_ids for o in outs] == [[i, i] for i in range(5)] and client.in_flight == 0


def test_an_answer_without_log_probs_is_refused_not_filled_with_zeros():
    with pytest.raises(BadAnswer) as e:
        parse_generate_response({"output_ids": [3, 4], "meta_info": {"finish_reason": "stop"}})
    assert e.value.reason == "engine_bad_answer:output_token_logprobs"


async def test_a_bad_answer_is_retried_and_a_spent_budget_names_the_field_and_the_engine():
    async with Engine() as eng:
        client = EngineClient(Endpoints(eng.url, [eng.url]), max_retries=2, vocab_size=4)
        client.retry_policy.base_delay = client.retry_policy.max_delay = 0.0
        with pytest.raises(HttpError) as e:
            await client.generate([1, 7], {"max_new_tokens": 2})  # echoes id 7: outside [0, 4)
        await client.close()
    assert e.value.reason == "engine_bad_answer:token_id" and f"(engine: {eng.url})" in str(e.value)
    assert "item 1: must be an integer in [0, 4): [-1.0, 7, None]" in str(e.value)
    assert len({b["rid"] for b in eng.generated}) == 3 and eng.aborted == []
    assert client.stats.as_dict() == {
        "requests": 3,
        "retries": 2,
        "failures": 1,
        "retries_engine_bad_answer:token_id": 2,
        "failures_engine_bad_answer:token_id": 1,
    }


async def test_a_closed_gate_answers_abort_for_requests_waiting_for_a_slot():
    gate = asyncio.Event()
    async with Engine(gate=gate) as eng:
        client = EngineClient(Endpoints(eng.url, [eng.url]), concurrency=1)
        first = asyncio.ensure_future(client.generate([1, 2], {}))
        await asyncio.wait_for(until_async(lambda: eng.waiting == 1, interval=0), 60)
        second = asyncio.ensure_future(client.generate([3, 4], {}))  # waits for the only slot
        client.gate.close()
        gate.set()
        out1, out2 = await asyncio.wait_for(asyncio.gather(first, second), 10)
        await client.close()
    assert out1.token_ids == [1, 2]  # already on the engine: its answer comes back
    assert (out2.token_ids, out2.log_probs, out2.finish_type) == ([], [], "abort")
    assert [b["input_ids"] for b in eng.generated] == [[1, 2]]  # the second never left the process


async def test_abort_until_settled_resends_until_the_tasks_finish_or_the_deadline():
    async with Engine() as eng:
        client = EngineClient(Endpoints(eng.url, [eng.url]))

        async def settles_on_the_third_abort():  # a request still in the router misses the first two
            while len(eng.aborted) < 3:
                eng.abort_received.clear()
                await eng.abort_received.wait()

        task = asyncio.ensure_future(settles_on_the_third_abort())
        done, late = await client.abort_until_settled({task}, timeout=30)
        assert (done, late, len(eng.aborted)) == ({task}, set(), 3)

        stuck = asyncio.ensure_future(asyncio.Event().wait())  # never answers the abort
        done, late = await client.abort_until_settled({stuck}, timeout=0.2)
        assert (done, late) == (set(), {stuck}) and len(eng.aborted) > 3
        stuck.cancel()
        await client.close()


async def test_abort_answers_are_counted_by_reason_and_never_raised():
    async with Engine() as good, Engine() as broken, Engine() as html:
        broken.abort_answer = web.Response(status=500, text="scheduler gone")
        html.abort_answer = web.Response(status=200, text="<html>ok</html>", content_type="text/html")
        client = EngineClient(Endpoints(good.url, [good.url, broken.url, html.url]))
        await client.abort_all()
        await client.close()
    assert [e.aborted for e in (good, broken, html)] == [[{"abort_all": True}]] * 3
    assert client.abort_stats.as_dict() == {"requests": 3, "retries": 0, "failures": 1, "failures_http_500": 1}


def test_the_vocabulary_bound_is_the_larger_of_tokenizer_and_model(tmp_path):
    (tmp_path / "config.json").write_text('{"vocab_size": 64}')

    class Tokenizer:
        def __len__(self):
            return 60

    client = EngineClient(Endpoints(None, []), tokenizer=Tokenizer(), tokenizer_path=str(tmp_path))
    assert client.vocab_size == 64
    assert EngineClient(Endpoints(None, []), tokenizer=Tokenizer()).vocab_size == 60
    assert EngineClient(Endpoints(None, [])).vocab_size is None  # no tokenizer, no model: ids only >= 0
