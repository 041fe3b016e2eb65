"""`/get_weight_version` answers are checked like `/generate` answers (issue 20): a malformed body is
the engine's fault, raised as BadWeightVersion naming the field (reason `engine_bad_answer:<field>`),
never a version guessed from it."""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.weights.http_engine import HttpEngine
from slime.weights.version_answer import MAX_VERSION_CHARS, BadWeightVersion, parse_weight_version_answer

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=15), inner, max_size=4),
    max_leaves=12,
)


def good(version) -> bool:
    return isinstance(version, str) and 0 < len(version) <= MAX_VERSION_CHARS and version.isprintable()


@settings(max_examples=300, deadline=None)
@given(body=JSON | st.dictionaries(st.just("weight_version"), JSON, min_size=1))
def test_any_json_is_a_version_only_when_sglangs_shape(body):
    for sent in (body, json.dumps(body), json.dumps(body).encode()):
        if isinstance(body, dict) and "weight_version" in body and good(body["weight_version"]):
            assert parse_weight_version_answer(sent) == body["weight_version"]
        else:
            with pytest.raises(BadWeightVersion) as e:
                parse_weight_version_answer(sent)
            assert e.value.reason in ("engine_bad_answer:body", "engine_bad_answer:weight_version")
            assert e.value.reason == f"engine_bad_answer:{e.value.field}"


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=64) | st.text(max_size=64))
def test_any_bytes_are_a_version_or_a_bad_answer_never_another_error(raw):
    try:
        version = parse_weight_version_answer(raw, "http://engine")
    except BadWeightVersion as e:
        assert str(e).startswith("http://engine: bad /get_weight_version answer (")
        return
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    assert version == json.loads(text)["weight_version"]


@pytest.mark.parametrize(
    "body, field, problem",
    [
        (b'{"weight_version": "1', "body", 'not JSON (JSONDecodeError): {"weight_version": "1'),
        (b"<html>502 Bad Gateway</html>", "body", "not JSON (JSONDecodeError): <html>502 Bad Gateway</html>"),
        (b'["3"]', "body", "a JSON list, not an object: ['3']"),
        (b'{"version": "3"}', "weight_version", "missing: {'version': '3'}"),
        (b'{"weight_version": null}', "weight_version", "a NoneType, not a string: None"),
        (b'{"weight_version": 3}', "weight_version", "a int, not a string: 3"),
        (b'{"weight_version": ""}', "weight_version", "not a version (empty, over 256 characters, or unprintable): "),
        (
            b'{"weight_version": "3\\n4"}',
            "weight_version",
            "not a version (empty, over 256 characters, or unprintable): 3\n4",
        ),
    ],
)
def test_an_engine_answering_a_bad_version_is_named_with_the_field(body, field, problem):
    with serving(body) as url:
        with pytest.raises(BadWeightVersion) as e:
            HttpEngine(url, timeout=30).get_weight_version()
    assert str(e.value) == f"{url}: bad /get_weight_version answer ({field}): {problem}"
    assert e.value.reason == f"engine_bad_answer:{field}"


def test_a_good_answer_is_the_version_as_sent():
    with serving(b'{"weight_version": "12", "extra": 1}') as url:
        assert HttpEngine(url, timeout=30).get_weight_version() == "12"


@contextlib.contextmanager
def serving(body: bytes) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 answering every GET with `body` (status 200, JSON type)."""

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
