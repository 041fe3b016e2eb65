"""Classified, budgeted retries; one session per event loop (`HttpClient`, `PerLoop`)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from aiohttp import web

from slime.testing.local_http import serve_app
from slime.utils.http_retry import AnswerError, HttpClient, HttpError, HttpStats, RetryPolicy, request_json
from slime.utils.per_loop import PerLoop

FAST = dict(base_delay=0.0, max_delay=0.0)  # retry at once: nothing here waits on a clock


class Server:
    """A local aiohttp app answering each POST /x with the next scripted (status, body)."""

    def __init__(self, script):
        self.script, self.seen = list(script), []

    async def handle(self, request):
        self.seen.append(await request.json())
        status, body = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(body, str):
            return web.Response(status=status, text=body)
        return web.json_response(body, status=status)

    async def __aenter__(self):
        self._serving = serve_app({"/x": self.handle})
        self.url = await self._serving.__aenter__() + "/x"
        return self

    async def __aexit__(self, *exc):
        await self._serving.__aexit__(*exc)


async def test_answer_on_first_attempt_counts_one_request():
    stats = HttpStats()
    async with Server([(200, {"ok": 1})]) as srv:
        assert await request_json("POST", srv.url, {"a": 1}, timeout=5, stats=stats) == {"ok": 1}
        assert await request_json("POST", srv.url, {"a": 2}, timeout=5) == {"ok": 1}  # own session, own stats
    assert srv.seen == [{"a": 1}, {"a": 2}]
    assert stats.as_dict() == {"requests": 1, "retries": 0, "failures": 0}


async def test_5xx_and_429_are_retried_with_the_next_payload():
    stats = HttpStats()
    async with Server([(503, "busy"), (429, "slow down"), (200, "plain text")]) as srv:
        body = await request_json(
            "POST",
            srv.url,
            {"n": 0},
            timeout=5,
            stats=stats,
            policy=RetryPolicy(max_retries=3, **FAST),
            on_retry=lambda p, failure: {"n": p["n"] + 1},
        )
    assert body == "plain text"
    assert srv.seen == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert stats.as_dict() == {"requests": 3, "retries": 2, "failures": 0, "retries_http_503": 1, "retries_http_429": 1}


async def test_4xx_is_raised_at_once_with_the_body():
    stats = HttpStats()
    async with Server([(400, "prompt is too long")]) as srv:
        with pytest.raises(HttpError) as e:
            await request_json("POST", srv.url, {}, timeout=5, stats=stats, policy=RetryPolicy(**FAST))
    assert (e.value.status, e.value.body, e.value.reason) == (400, "prompt is too long", "http_400")
    assert len(srv.seen) == 1 and stats.failures == 1 and stats.total_retries == 0


async def test_spent_budget_names_attempts_and_the_reason():
    stats = HttpStats()
    async with Server([(502, "bad gateway")]) as srv:
        with pytest.raises(HttpError) as e:
            await request_json("POST", srv.url, {}, timeout=5, stats=stats, policy=RetryPolicy(max_retries=2, **FAST))
    assert len(srv.seen) == 3 and (e.value.status, e.value.reason) == (502, "http_502")
    assert "failed after 3 attempt(s)" in str(e.value) and str(e.value).endswith("cause: http_502: bad gateway")
    assert stats.as_dict() == {
        "requests": 3,
        "retries": 2,
        "failures": 1,
        "retries_http_502": 2,
        "failures_http_502": 1,
    }


async def test_a_spent_budget_is_reported_by_its_first_fault_not_the_refusals_it_led_to():
    async with Server([(500, "cut"), (503, "no_available_workers")]) as srv:
        with pytest.raises(HttpError) as e:
            await request_json("POST", srv.url, {}, timeout=5, policy=RetryPolicy(max_retries=2, **FAST))
    assert (e.value.reason, e.value.status) == ("http_500", 503)
    assert str(e.value).endswith("cause: http_500: cut; last: http_503: no_available_workers")


async def test_an_unusable_2xx_answer_is_retried_under_the_checks_reason():
    def answer(raw):
        if raw != b"good":
            raise AnswerError(f"not good: {raw!r}", reason="bad_shape")
        return "checked"

    stats = HttpStats()
    failures = []
    async with Server([(200, "<html>"), (200, {"a": 1}), (200, "good")]) as srv:
        body = await request_json(
            "POST",
            srv.url,
            {"n": 0},
            timeout=5,
            stats=stats,
            answer=answer,
            policy=RetryPolicy(max_retries=3, **FAST),
            on_retry=lambda p, failure: failures.append(failure) or p,
        )
    assert body == "checked" and [f.reason for f in failures] == ["bad_shape", "bad_shape"]
    assert not any(f.may_still_run for f in failures)  # an answer came back: nothing left running
    assert stats.retries == {"bad_shape": 2}


async def test_connection_refused_is_retried_then_reported():
    async with Server([(200, {})]) as srv:
        url = srv.url
    stats = HttpStats()  # the server is gone: its port refuses connections
    with pytest.raises(HttpError) as e:
        await request_json("POST", url, {}, timeout=5, stats=stats, policy=RetryPolicy(max_retries=1, **FAST))
    assert e.value.reason == "connection" and e.value.status is None and stats.retries == {"connection": 1}


async def test_a_window_of_zero_allows_no_retry():
    async with Server([(503, "x")]) as srv:
        with pytest.raises(HttpError, match="after 1 attempt"):
            await request_json(
                "POST", srv.url, {}, timeout=5, policy=RetryPolicy(max_retries=5, window=0.0, base_delay=0.01)
            )
    assert len(srv.seen) == 1


async def test_http_client_keeps_one_session_per_loop_until_closed():
    client = HttpClient()
    first = client.session()
    assert client.session() is first
    async with Server([(200, {"v": 1})]) as srv:
        assert await client.post(srv.url, {}, timeout=5) == {"v": 1}
    await client.close()
    assert first.closed
    second = client.session()
    assert second is not first and not second.closed
    await second.close()
    third = client.session()  # closed from outside: replaced
    assert third is not second
    await client.close()


def test_per_loop_values_are_per_loop_and_remade_when_unusable():
    made = []

    def make():
        made.append(object())
        return made[-1]

    broken = set()
    cache = PerLoop(make, usable=lambda v: v not in broken)

    async def get_twice():
        return cache.get(), cache.get()

    a1, a2 = asyncio.run(get_twice())
    b1, _ = asyncio.run(get_twice())
    assert a1 is a2 and b1 is not a1 and len(made) == 2

    async def remade_after_break():
        v = cache.get()
        broken.add(v)
        w = cache.get()
        return v, w, cache.pop(), cache.pop()

    v, w, popped, again = asyncio.run(remade_after_break())
    assert w is not v and popped is w and again is None


def test_per_loop_in_two_threads_at_once():
    cache = PerLoop(object)
    ready, results = threading.Barrier(2), {}

    def worker(name):
        async def go():
            mine = cache.get()
            ready.wait(timeout=10)  # both loops hold a value before either reads again
            results[name] = (mine, cache.get())

        asyncio.run(go())

    threads = [threading.Thread(target=worker, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert results["a"][0] is results["a"][1] and results["b"][0] is results["b"][1]
    assert results["a"][0] is not results["b"][0]


async def test_a_url_given_as_a_function_is_asked_again_before_each_retry():
    """A router restarted on another node is at a new address: the retry goes there."""
    from slime.utils.misc import find_free_port

    stats = HttpStats()
    async with Server([(200, {"ok": 1})]) as srv:
        gone = f"http://127.0.0.1:{find_free_port()}/x"  # nothing listens: refused
        urls = iter([gone, srv.url])
        asked = []

        def where() -> str:
            asked.append(next(urls))
            return asked[-1]

        body = await request_json(
            "POST", where, {"n": 1}, timeout=5, stats=stats, policy=RetryPolicy(max_retries=2, **FAST)
        )
    assert body == {"ok": 1} and asked == [gone, srv.url] and srv.seen == [{"n": 1}]
    assert stats.as_dict() == {"requests": 2, "retries": 1, "failures": 0, "retries_connection": 1}


async def test_every_kind_of_answer_gives_its_connection_back_to_the_pool():
    """The response is awaited, not entered with `async with`: its release is request_json's own `finally`.
    With a pool of one connection, a connection kept by any answer (2xx read or refused by `answer`, 5xx
    retried, 4xx raised, a request cancelled while its body is read) would hold every later request; one
    left to the garbage collector instead says so in debug mode (aiohttp's "Unclosed response")."""
    import warnings

    import aiohttp

    asyncio.get_running_loop().set_debug(True)

    hold = asyncio.Event()

    async def slow(request):  # the status and the first bytes of the body, then nothing until `hold`
        reply = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "20"})
        await reply.prepare(request)
        await reply.write(b'{"ok": ')
        await hold.wait()
        return reply

    def refuse(raw: bytes):
        raise AnswerError("no", reason="refused")

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        await _every_answer_kind(session, slow, hold, refuse)
    assert not [w for w in warned if "Unclosed response" in str(w.message)]


async def _every_answer_kind(session, slow, hold, refuse) -> None:
    try:
        async with Server(
            [(200, {"ok": 1}), (200, {"ok": 2}), (503, "busy"), (200, {"ok": 3}), (404, "no"), (200, {"ok": 4})]
        ) as srv:
            serving = serve_app({"/slow": slow})
            slow_url = await serving.__aenter__() + "/slow"

            def ask(policy=RetryPolicy(max_retries=0), **kw):
                return request_json("POST", srv.url, {}, timeout=5, session=session, policy=policy, **kw)

            assert await ask() == {"ok": 1}
            with pytest.raises(HttpError) as refused:
                await ask(answer=refuse)
            assert refused.value.reason == "refused"
            assert await ask(policy=RetryPolicy(max_retries=1, **FAST)) == {"ok": 3}  # the 503, then a retry
            with pytest.raises(HttpError) as missing:
                await ask()
            assert missing.value.status == 404
            cancelled = asyncio.ensure_future(request_json("POST", slow_url, {}, timeout=5, session=session))
            await asyncio.sleep(0.2)
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            hold.set()
            assert await asyncio.wait_for(ask(), 5) == {"ok": 4}
            await serving.__aexit__(None, None, None)
    finally:
        await session.close()
