"""verl compatibility of the tool system, search: verl's search YAML with only its URL changed, against a
local retriever (`slime.testing.retriever`): the result text, retries, and what the model reads on errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slime.tools.registry import ToolConfigError, load_tool_config
from slime.tools.search_tool import SearchTool

ROOT = Path(__file__).resolve().parents[1]
VERL = ROOT / "configs" / "verl"


# ---- search against a local retriever -------------------------------------------------------------
CORPUS = [
    "Paris\nParis is the capital of France.",
    "Berlin\nBerlin is the capital of Germany.",
    "Rome\nRome is the capital of Italy and was founded long ago.",
]


@pytest.fixture()
def retriever():
    from slime.testing.retriever import Retriever

    with Retriever(CORPUS) as r:
        yield r


def search_tool(tmp_path: Path, url: str, **extra: Any) -> SearchTool:
    """verl's search YAML with only the URL (and extra config) changed."""
    import yaml

    data = yaml.safe_load((VERL / "search_tool_config.yaml").read_text())
    data["tools"][0]["config"].update(retrieval_service_url=url, **extra)
    data["tools"][0]["class_name"] = "slime.tools.search_tool.SearchTool"
    p = tmp_path / "search.yaml"
    p.write_text(yaml.safe_dump(data))
    return load_tool_config(p)["search"]


async def test_search_tool_against_local_retriever(tmp_path, retriever):
    tool = search_tool(tmp_path, retriever.url, topk=2)
    iid, _ = await tool.create()
    resp, reward, metrics = await tool.execute(iid, {"query_list": ["capital of Germany", "Italy founded"]})
    assert retriever.requests == [
        {"queries": ["capital of Germany", "Italy founded"], "topk": 2, "return_scores": True}
    ]
    expected = (
        "Doc 1 (Title: Berlin)\nBerlin is the capital of Germany.\n\n"
        "Doc 2 (Title: Paris)\nParis is the capital of France.\n---\n"
        "Doc 1 (Title: Rome)\nRome is the capital of Italy and was founded long ago.\n\n"
        "Doc 2 (Title: Paris)\nParis is the capital of France."
    )
    assert resp.text == json.dumps({"result": expected}) and reward == 0.0
    assert metrics == {"query_count": 2, "status": "success", "total_results": 4, "api_request_error": None}
    assert tool.results(iid) == [resp.text] and await tool.calc_reward(iid) == 0.0
    await tool.release(iid)
    assert tool.results(iid) == []


async def test_search_tool_retries_then_reports(tmp_path, retriever):
    tool = search_tool(tmp_path, retriever.url, max_retries=2, retry_base_delay=0.01)
    retriever.fail_next(2, 503)
    resp, _, metrics = await tool.execute("none", {"query_list": ["Paris"]})
    assert metrics["status"] == "success" and len(retriever.requests) == 3
    assert json.loads(resp.text)["result"].startswith("Doc 1 (Title: Paris)")
    retriever.fail_next(3, 502)
    resp, _, metrics = await tool.execute("none", {"query_list": ["Paris"]})
    assert metrics["status"] == "api_error" and len(retriever.requests) == 6
    assert resp.text == json.dumps({"result": "Search error: server error (HTTP 502) after 3 attempt(s)"})
    retriever.fail_next(1, 400)  # a client error is not retried
    _, _, metrics = await tool.execute("none", {"query_list": ["Paris"]})
    assert metrics["status"] == "api_error" and "HTTP 400" in metrics["api_request_error"]
    assert len(retriever.requests) == 7


async def test_search_tool_bad_arguments_and_no_server(tmp_path):
    from slime.utils.misc import find_free_port

    tool = search_tool(tmp_path, f"http://127.0.0.1:{find_free_port()}/retrieve", max_retries=1, retry_base_delay=0.01)
    resp, _, metrics = await tool.execute("i", {"query_list": []})
    assert json.loads(resp.text) == {"result": "Error: 'query_list' is missing, empty, or not a list in parameters."}
    resp, _, metrics = await tool.execute("i", {"query_list": ["x"]})
    assert metrics["status"] == "api_error" and "connection error" in metrics["api_request_error"]
    assert "after 2 attempt(s)" in json.loads(resp.text)["result"]


def test_search_tool_needs_a_url(tmp_path):
    with pytest.raises(ToolConfigError, match="config.retrieval_service_url is required"):
        search_tool(tmp_path, "")
