"""HTTP connections are closed by their owner: the runtime a binding owns closes its client's pools and
sessions when it is unbound or replaced, an `HttpClient` closes them on every loop they were opened
on, and a server sharing a client closes only its own loop's. Each test drives the real code path
(slime's `http_utils.post` through the bound runtime, a real aiohttp server) and checks the state of
the pool it went through (`HttpClient.pool()`, per loop) and that no ResourceWarning ("Unclosed client
session", "unclosed transport") is left for gc."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import warnings
from types import SimpleNamespace
from typing import Iterator

from aiohttp import web

from slime.rollout.runtime import RolloutRuntime, bound, unbind
from slime.testing.local_http import serve_app
from slime.testing.runtime import bind_runtime
from slime.utils.async_utils import run
from slime.utils.http_retry import HttpClient
from slime.utils.http_utils import post


@contextlib.contextmanager
def loop_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop running in its own thread, stopped and closed at the end."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-loop", daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


@contextlib.contextmanager
def echo_server(loop: asyncio.AbstractEventLoop) -> Iterator[str]:
    """A real HTTP peer on `loop`: POST /generate answers {"got": <the body>}."""

    async def generate(request: web.Request) -> web.Response:
        return web.json_response({"got": await request.json()})

    served = serve_app({"/generate": generate})
    url = asyncio.run_coroutine_threadsafe(served.__aenter__(), loop).result(30)
    try:
        yield url
    finally:
        asyncio.run_coroutine_threadsafe(served.__aexit__(None, None, None), loop).result(30)


def args_for(url: str) -> SimpleNamespace:
    from slime.utils.plugin_args import completed

    host, port = url.removeprefix("http://").split(":")
    return completed(
        SimpleNamespace(
            sglang_router_ip=host,
            sglang_router_port=int(port),
            sglang_server_concurrency=2,
            rollout_num_engines=1,
            request_timeout=10.0,
            request_max_retries=0,
        )
    )


async def _session_of(client: HttpClient):
    """The running loop's pool: what `post`, `get` and the engine client's requests go through."""
    return client.pool()


async def _aiohttp_session_of(client: HttpClient):
    return client.session()


def unclosed_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning) and "nclosed" in str(w.message)]


def post_through_runtime(url: str, runtime: RolloutRuntime, n: int):
    """Plugin traffic as slime's rollout modules send it (`http_utils.post` on the background loop):
    the answers, and the session it went through."""
    answers = [run(post(f"{url}/generate", {"i": i})) for i in range(n)]
    return answers, run(_session_of(runtime.client.http))


def test_unbinding_a_runtime_the_binding_owns_closes_its_session_and_leaves_nothing_for_gc():
    with loop_thread() as server_loop, echo_server(server_loop) as url:
        runtime = bind_runtime(args_for(url))
        answers, session = post_through_runtime(url, runtime, 3)
        assert answers == [{"got": {"i": 0}}, {"got": {"i": 1}}, {"got": {"i": 2}}]
        assert bound() is runtime and not session.closed
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            unbind()
            del runtime
            gc.collect()
        assert bound() is None and session.closed
        assert unclosed_warnings(caught) == []


def test_binding_another_runtime_closes_the_one_the_binding_owned():
    with loop_thread() as server_loop, echo_server(server_loop) as url:
        first = bind_runtime(args_for(url))
        _, first_session = post_through_runtime(url, first, 1)
        second = bind_runtime(args_for(url))
        assert first_session.closed and bound() is second
        answers, second_session = post_through_runtime(url, second, 1)
        assert answers == [{"got": {"i": 0}}] and second_session is not first_session and not second_session.closed
        unbind()
        assert second_session.closed


def test_a_runtime_its_creator_owns_stays_open_when_unbound_until_it_closes():
    with loop_thread() as server_loop, echo_server(server_loop) as url:
        args = args_for(url)
        from slime.rollout.engine_client import EngineClient
        from slime.utils.endpoints import Endpoints

        runtime = RolloutRuntime(args, EngineClient.from_args(args, Endpoints(url))).bind()
        closed_servers = []
        runtime.on_close(lambda: closed_servers.append("gateway"))
        _, session = post_through_runtime(url, runtime, 1)
        unbind(runtime)
        assert not session.closed and closed_servers == []  # a controller closes it after unbinding
        runtime.close()
        assert session.closed and closed_servers == ["gateway"]


async def test_http_client_close_closes_its_sessions_on_every_running_loop():
    client = HttpClient()
    with loop_thread() as other_loop, echo_server(other_loop) as url:
        there = asyncio.run_coroutine_threadsafe(_session_of(client), other_loop).result(30)
        there_aiohttp = asyncio.run_coroutine_threadsafe(_aiohttp_session_of(client), other_loop).result(30)
        answer = asyncio.run_coroutine_threadsafe(
            client.post(f"{url}/generate", {"x": 1}, timeout=10), other_loop
        ).result(30)
        here, here_aiohttp = client.pool(), client.session()
        assert answer == {"got": {"x": 1}} and there is not here
        assert await client.post(f"{url}/generate", {"x": 2}, timeout=10) == {"got": {"x": 2}}
        await client.close()
        assert here.closed and there.closed and here_aiohttp.closed and there_aiohttp.closed


async def test_close_loop_closes_only_the_running_loops_session():
    """A server sharing a client (the gateway on its own loop) closes its loop's session only."""
    client = HttpClient()
    with loop_thread() as other_loop:
        there = asyncio.run_coroutine_threadsafe(_session_of(client), other_loop).result(30)
        here, here_aiohttp = client.pool(), client.session()
        await client.close_loop()
        assert here.closed and here_aiohttp.closed and not there.closed
        await client.close()
        assert there.closed


def _start_failure(extra_args: list[str]) -> str:
    """The error of a sandbox server that cannot start (only its text: a traceback would keep the
    child's handle alive past the check)."""
    from slime.sandbox.server import start_local_sandbox

    try:
        start_local_sandbox(extra_args=extra_args, ready_timeout=60)
    except RuntimeError as e:
        return str(e)
    raise AssertionError("the sandbox server started with an unknown flag")


def test_a_sandbox_server_that_fails_to_start_leaves_no_pipe_or_process_open():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        error = _start_failure(["--no-such-flag"])
        gc.collect()
    assert error.startswith("slime-sandbox exited with code 2: ") and "--no-such-flag" in error
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_a_session_of_a_loop_that_no_longer_runs_is_counted_not_silently_dropped(caplog):
    client = HttpClient()
    stopped = asyncio.new_event_loop()
    try:
        orphan = stopped.run_until_complete(_session_of(client))
        with caplog.at_level("INFO", logger="slime.utils.http_retry"):
            run(client.close())
        assert not orphan.closed
        assert [r.getMessage() for r in caplog.records] == [
            "1 HTTP session(s) of event loops that no longer run could not be closed"
        ]
        stopped.run_until_complete(orphan.close())  # (its loop's owner can still close it)
    finally:
        stopped.close()


async def test_binding_another_runtime_inside_a_coroutine_closes_the_old_one_on_that_loop_without_blocking_it():
    with loop_thread() as server_loop, echo_server(server_loop) as url:
        first = bind_runtime(args_for(url))
        assert await first.client.post(f"{url}/generate", {"i": 7}, timeout=10) == {"got": {"i": 7}}
        session = first.client.http.pool()
        second = bind_runtime(args_for(url))  # returns at once: waiting here would block this loop
        assert bound() is second and first.closing is not None
        await first.closing
        assert session.closed
        unbind()
        assert second.closing is not None
        await second.closing
