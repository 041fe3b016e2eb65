"""A retrieval server speaking Search-R1's `/retrieve` API, for tests of search tools and plugins.

`POST /retrieve {"queries": [...], "topk": k, "return_scores": bool}` answers
`{"result": [[{"document": {"id", "contents"}, "score"}, ...] per query]}` (bare documents when
return_scores is false), ranking a fixed corpus by words shared with the query (ties: corpus
order), so a test knows exactly which passages come back. `fail_next(n, status)` makes the next n
requests fail with that HTTP status (retry tests). Binds 127.0.0.1 only.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from slime.testing.threaded_server import ThreadedServer

_WORD = re.compile(r"\w+")


def rank(corpus: list[str], query: str, k: int) -> list[tuple[int, int]]:
    """(doc index, shared words) of the k best documents."""
    q = set(_WORD.findall(query.lower()))
    scored = [(i, len(q & set(_WORD.findall(doc.lower())))) for i, doc in enumerate(corpus)]
    return sorted(scored, key=lambda t: (-t[1], t[0]))[:k]


class Retriever:
    """Serve the corpus (each document "Title\\ntext") from a background thread of this process."""

    def __init__(self, corpus: list[str], port: int | None = None):
        self.corpus = list(corpus)
        self.requests: list[dict[str, Any]] = []
        self._failures: list[int] = []
        self._lock = threading.Lock()
        app = FastAPI()

        @app.post("/retrieve")
        async def retrieve(request: Request):
            body = await request.json()
            with self._lock:
                self.requests.append(body)
                status = self._failures.pop(0) if self._failures else None
            if status is not None:
                return JSONResponse({"error": "injected failure"}, status_code=status)
            k = int(body.get("topk", 3))
            results = []
            for q in body.get("queries", []):
                hits = rank(self.corpus, str(q), k)
                docs = [{"id": str(i), "contents": self.corpus[i]} for i, _ in hits]
                results.append(
                    [{"document": d, "score": float(s)} for d, (_, s) in zip(docs, hits)]
                    if body.get("return_scores", True)
                    else docs
                )
            return {"result": results}

        self._server = ThreadedServer(app, "127.0.0.1", port or 0, what="retriever", thread_name="test-retriever")
        self.port = self._server.port
        self.url = f"{self._server.url}/retrieve"

    def fail_next(self, n: int, status: int = 503) -> None:
        with self._lock:
            self._failures.extend([status] * n)

    def start(self, timeout: float = 20.0) -> "Retriever":
        self._server.start(timeout)
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> "Retriever":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
