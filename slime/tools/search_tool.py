"""`search`: ask a retrieval server for passages (verl's SearchTool, Search-R1's retriever API).

Config (verl's keys):
  retrieval_service_url     POST endpoint, e.g. http://127.0.0.1:8000/retrieve (required)
  topk                      passages per query (default 3)
  timeout                   seconds per HTTP attempt (default 30)
  num_workers               concurrent requests per process (default 120)
  rate_limit                concurrent requests per process, too (default 120): the smaller wins
  enable_global_rate_limit  accepted for verl configs; the limit here is per process
Extra: max_retries (default 3) for 5xx / connection errors / timeouts, retry_base_delay (0.5 s,
doubling, at most 5 s between attempts).

Request `{"queries": [...], "topk": k, "return_scores": true}`; answer
`{"result": [[{"document": {"contents": "Title\\ntext"}, "score": s}, ...], ...]}` (one list per
query; bare documents without "document"/"score" are read too). What the model sees is verl's
text exactly: `{"result": "Doc 1 (Title: ...)\\n...\\n---\\n..."}` as JSON, or
`{"result": "Search error: ..."}`, so prompts and reward code written for verl keep working.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from uuid import uuid4

import aiohttp

from slime.tools.base_tool import BaseTool
from slime.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

logger = logging.getLogger(__name__)

_RETRY_STATUS = (500, 502, 503, 504)


def passages_to_text(docs: list[Any]) -> str:
    """verl's `_passages2string`: `Doc i (Title: first line)\\nrest`, blank-line separated."""
    parts = []
    for i, item in enumerate(docs):
        doc = item.get("document", item) if isinstance(item, dict) else {"contents": str(item)}
        content = str(doc.get("contents", "")) if isinstance(doc, dict) else str(doc)
        title, _, text = content.partition("\n")
        parts.append(f"Doc {i + 1} (Title: {title})\n{text}")
    return "\n\n".join(parts).strip()


class _GiveUp(Exception):
    pass


class SearchTool(BaseTool):
    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)
        c = self.config
        self.retrieval_service_url = str(c.get("retrieval_service_url") or "")
        if not self.retrieval_service_url:
            raise ValueError(
                "config.retrieval_service_url is required (the retriever's POST endpoint, "
                "e.g. http://127.0.0.1:8000/retrieve)"
            )
        self.topk = int(c.get("topk", 3))
        self.timeout = float(c.get("timeout", 30))
        self.num_workers = int(c.get("num_workers", 120))
        self.rate_limit = int(c.get("rate_limit", 120))
        self.max_retries = int(c.get("max_retries", 3))
        self.retry_base_delay = float(c.get("retry_base_delay", 0.5))
        if min(self.topk, self.num_workers, self.rate_limit) < 1 or self.timeout <= 0 or self.max_retries < 0:
            raise ValueError("config: topk, num_workers and rate_limit must be >= 1, timeout > 0, max_retries >= 0")
        self._instances: dict[str, list[str]] = {}
        self._slots: dict[int, asyncio.Semaphore] = {}  # per event loop

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        iid = instance_id or str(uuid4())
        self._instances[iid] = []
        return iid, ToolResponse()

    def service_urls(self) -> dict[str, str]:
        return {"retrieval_service_url": self.retrieval_service_url}

    def results(self, instance_id: str) -> list[str]:
        """What the searches of one trajectory returned (verl's calc_reward value)."""
        return list(self._instances.get(instance_id, []))

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0  # a search is not graded; the outcome reward judges the answer

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        queries = parameters.get("query_list") if isinstance(parameters, dict) else None
        if not queries or not isinstance(queries, list):
            msg = "Error: 'query_list' is missing, empty, or not a list in parameters."
            return ToolResponse(text=json.dumps({"result": msg})), 0.0, {}
        queries = [str(q) for q in queries]
        metrics: dict[str, Any] = {
            "query_count": len(queries),
            "status": "unknown",
            "total_results": 0,
            "api_request_error": None,
        }
        try:
            body = await self._post({"queries": queries, "topk": self.topk, "return_scores": True})
        except _GiveUp as e:
            metrics.update(status="api_error", api_request_error=str(e))
            text = json.dumps({"result": f"Search error: {e}"}, ensure_ascii=False)
        else:
            text = self._format(body, metrics)
        if instance_id in self._instances:
            self._instances[instance_id].append(text.strip())
        return ToolResponse(text=text), 0.0, metrics

    def _format(self, body: Any, metrics: dict[str, Any]) -> str:
        per_query = body.get("result") if isinstance(body, dict) else None
        if not per_query:
            metrics["status"] = "no_results"
            return json.dumps({"result": "No search results found."}, ensure_ascii=False)
        try:
            blocks = [passages_to_text(docs if isinstance(docs, list) else [docs]) for docs in per_query]
        except (AttributeError, TypeError) as e:
            metrics["status"] = "processing_error"
            return json.dumps({"result": f"Error processing search results: {e}"}, ensure_ascii=False)
        metrics.update(status="success", total_results=sum(len(d) if isinstance(d, list) else 1 for d in per_query))
        return json.dumps({"result": "\n---\n".join(blocks)}, ensure_ascii=False)

    def _slot(self) -> asyncio.Semaphore:
        loop_id = id(asyncio.get_running_loop())
        sem = self._slots.get(loop_id)
        if sem is None:
            sem = self._slots[loop_id] = asyncio.Semaphore(min(self.num_workers, self.rate_limit))
        return sem

    async def _post(self, payload: dict[str, Any]) -> Any:
        """The JSON answer, retrying 5xx / connection errors / timeouts at most `max_retries` times."""
        last = ""
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with self._slot(), aiohttp.ClientSession(timeout=timeout) as session:
            for attempt in range(self.max_retries + 1):
                if attempt:
                    await asyncio.sleep(min(5.0, self.retry_base_delay * 2 ** (attempt - 1)))
                try:
                    async with session.post(
                        self.retrieval_service_url, json=payload, headers={"Accept": "application/json"}
                    ) as resp:
                        if resp.status in _RETRY_STATUS:
                            last = f"server error (HTTP {resp.status})"
                            continue
                        if resp.status >= 400:
                            raise _GiveUp(
                                f"the retriever rejected the request (HTTP {resp.status}: {(await resp.text())[:200]})"
                            )
                        try:
                            return await resp.json(content_type=None)
                        except json.JSONDecodeError as e:
                            raise _GiveUp(f"the retriever's answer is not JSON: {e}") from None
                except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
                    last = f"connection error: {type(e).__name__}: {e}"
                except asyncio.TimeoutError:
                    last = f"no answer within {self.timeout:g}s"
        raise _GiveUp(f"{last} after {self.max_retries + 1} attempt(s)")
