"""Issue 20: the router's `/workers` answer is checked before the fleet or the engine client reads it;
a bad one is named (router URL, field, excerpt), counted, and never half-trusted."""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.fleet.router import list_workers, unregister_worker
from slime.fleet.router_answer import BadRouterAnswer, Worker, parse_workers
from slime.rollout.engine_client import EngineClient
from slime.utils.endpoints import Endpoints

ROUTER = "http://127.0.0.1:9"
# sglang-router 0.3.2's answer, as it gives it (one worker)
REAL = {
    "workers": [
        {
            "id": "8788d4ad-9fcf-4896-9045-e02c0fac9b66",
            "url": "http://127.0.0.1:58737",
            "model_id": "/tmp/m",
            "priority": 50,
            "cost": 1.0,
            "worker_type": "regular",
            "is_healthy": True,
            "load": 0,
            "connection_mode": "HTTP",
            "metadata": {},
            "disable_health_check": False,
        }
    ],
    "total": 1,
    "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": 1},
}


def test_the_routers_own_answer_gives_its_workers():
    assert parse_workers(json.dumps(REAL).encode(), ROUTER) == [
        Worker(url="http://127.0.0.1:58737", id="8788d4ad-9fcf-4896-9045-e02c0fac9b66", healthy=True)
    ]
    assert parse_workers([{"url": "http://a:1"}], ROUTER) == [Worker("http://a:1", None, True)]


@pytest.mark.parametrize(
    "body, field, excerpt",
    [
        (b"<html><body>Bad Gateway</body></html>", "body", "not JSON: <html><body>Bad Gateway</body></html>"),
        (b'{"workers": [{"url": "http://a:1"', "body", 'not JSON: {"workers": [{"url": "http://a:1"'),
        ({"urls": ["http://a:1"]}, "workers", "no list of workers: {'urls': ['http://a:1']}"),
        ("workers", "workers", "no list of workers: workers"),
        ({"workers": ["http://a:1"]}, "workers", "item 0 is not an object: http://a:1"),
        ({"workers": [{"id": "x"}]}, "url", "item 0: not an http(s) URL: {'id': 'x'}"),
        ({"workers": [{"url": 5}]}, "url", "item 0: not an http(s) URL: {'url': 5}"),
        ({"workers": [{"url": "http://b:2"}, {"url": "a:1"}]}, "url", "item 1: not an http(s) URL: {'url': 'a:1'}"),
        (
            {"workers": [{"url": "http://a:1", "id": 7}]},
            "id",
            "item 0: not a worker id: {'id': 7, 'url': 'http://a:1'}",
        ),
        ({"workers": [{"url": "http://a:1", "id": "../health"}]}, "id", "item 0: not a worker id: "),
        ({"workers": [{"url": "http://a:1", "is_healthy": "yes"}]}, "is_healthy", "item 0: not a boolean: "),
    ],
)
def test_a_bad_answer_names_the_router_the_field_and_an_excerpt(body, field, excerpt):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(BadRouterAnswer) as e:
        parse_workers(raw, ROUTER)
    assert e.value.field == field and e.value.reason == f"router_bad_answer:{field}"
    assert str(e.value).startswith(f"bad router answer from {ROUTER}/workers ({field}): {excerpt}")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["url", "id", "is_healthy", "workers", "load"]), inner, max_size=4)
    ),
    max_leaves=12,
)
worker_like = st.fixed_dictionaries(
    {},
    optional={
        "url": st.sampled_from(["http://a:1", "https://b:2", "", "a:1", None, 3]),
        "id": st.sampled_from(["w1", "", "a/b", None, 5]),
        "is_healthy": st.sampled_from([True, False, "true", 1, None]),
    },
)


@given(
    st.one_of(
        json_values,
        st.fixed_dictionaries({"workers": st.lists(worker_like | json_values, max_size=4)}),
        st.binary(max_size=40),
    )
)
@settings(max_examples=100, deadline=None)
def test_any_answer_gives_valid_workers_or_a_named_refusal(body):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        workers = parse_workers(raw, ROUTER)
    except BadRouterAnswer as e:
        assert e.reason.startswith("router_bad_answer:") and ROUTER in str(e) and len(str(e)) < 400
        return
    for w in workers:
        assert w.url.startswith(("http://", "https://")) and isinstance(w.healthy, bool)
        assert w.id is None or (isinstance(w.id, str) and w.id and "/" not in w.id)


def serve_workers(body: bytes, status: int = 200):
    async def workers(request):
        return web.Response(body=body, status=status, content_type="application/json")

    app = web.Application()
    app.router.add_get("/workers", workers)
    return app


async def test_the_engine_client_counts_a_bad_answer_and_aborts_nowhere():
    async with TestServer(
        serve_workers(b'{"workers": [{"url": "http://a:1"}, {"url": null}]}'), host="127.0.0.1"
    ) as server:
        url = str(server.make_url("")).rstrip("/")
        client = EngineClient(Endpoints(url, []))
        assert await client.engine_urls() == []
        await client.close()
    assert client.stats.failure_reasons == {"router_bad_answer:url": 1}


async def test_the_engine_client_lists_the_workers_of_a_good_answer():
    async with TestServer(serve_workers(json.dumps(REAL).encode()), host="127.0.0.1") as server:
        client = EngineClient(Endpoints(str(server.make_url("")).rstrip("/"), []))
        assert await client.engine_urls() == ["http://127.0.0.1:58737"]
        await client.close()
    assert client.stats.failures == 0


def test_the_fleet_refuses_a_bad_answer_by_name_and_counts_it():
    answers = [(200, b"<html>502 Bad Gateway</html>"), (500, b'{"workers": [{"url": "http://a:1"}]}')]

    class Router(BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = answers.pop(0)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Router)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url, counts = f"http://127.0.0.1:{server.server_address[1]}", Counter()
    try:
        with pytest.raises(BadRouterAnswer, match=r"\(body\): not JSON: <html>502 Bad Gateway"):
            unregister_worker(url, "http://a:1", counts)
        with pytest.raises(BadRouterAnswer, match=r"\(status\): HTTP 500: "):
            list_workers(url, counts)
    finally:
        server.shutdown()
        server.server_close()
    assert counts == {"router_bad_answer:body": 1, "router_bad_answer:status": 1}
