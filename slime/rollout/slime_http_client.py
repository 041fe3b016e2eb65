"""`SlimeHttpClient`: the httpx client slime's rollout code finds at `slime.utils.http_utils._http_client`.

slime keeps one module-global `httpx.AsyncClient`, created by `init_http_client(args)` in its
RolloutManager, and its plugins use it directly: `sglang_streaming_rollout.generate_streaming` reads
SGLang's server-sent events from `/generate` through `_http_client.stream("POST", ...)`. Here there is
no module-level client (services are objects passed down): the rollout runtime, which our
RolloutManager creates where slime's calls `init_http_client`, owns this object, and `http_utils`
answers `_http_client` with the bound runtime's one.

It is httpx's own client (a plugin may call any of its methods), one per event loop (httpx connections
are loop-bound), with a deadline slime's has not: `--request-timeout` seconds to connect and between two
reads (a stream that goes silent fails, one that keeps sending runs as long as the engine generates).
A stream to an engine's `/generate` also takes a slot of the engine client's in-flight bound
(`--sglang-server-concurrency`) and feeds the rollout's progress like our own requests; an HTTP failure
in it becomes our `HttpError` (counted by reason), which the rollout loop turns into a FAILED sample
instead of ending the rollout.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, AsyncIterator

from slime.rollout.engine_client import CLOSE_TIMEOUT, EngineClient
from slime.utils.http_retry import HttpError
from slime.utils.generate_traffic import is_generate_url, output_token_count
from slime.utils.per_loop import PerLoop, close_on_their_loops


class SlimeHttpClient:
    def __init__(self, engine_client: EngineClient):
        self.engine_client = engine_client
        self._clients: PerLoop[Any] = PerLoop(self._new_client, usable=lambda c: not c.is_closed)

    def _new_client(self) -> Any:
        import httpx  # only slime-style plugins need it

        ec = self.engine_client
        return httpx.AsyncClient(
            limits=httpx.Limits(max_connections=ec.concurrency),
            timeout=httpx.Timeout(ec.request_timeout),
            trust_env=False,
        )  # engine traffic never goes through a system proxy

    def client(self) -> Any:
        """The running loop's `httpx.AsyncClient`."""
        return self._clients.get()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # copy/pickle probes and our own attributes are not httpx's
            raise AttributeError(name)
        return getattr(self.client(), name)  # post, get, request, send...: httpx's, unchanged

    @contextlib.asynccontextmanager
    async def stream(self, method: str, url: Any, **kw: Any) -> AsyncIterator[Any]:
        """httpx's `stream`; to `/generate`, bounded and counted (see the module docstring)."""
        import httpx

        if not is_generate_url(str(url)):
            async with self.client().stream(method, url, **kw) as response:
                yield response
            return
        ec = self.engine_client
        async with ec.semaphore:
            ec.in_flight += 1
            ec.stats.requests += 1
            try:
                async with self.client().stream(method, url, **kw) as response:
                    lines = _LastEvent(response)
                    yield lines.response
                ec.progress.on_response(lines.tokens())
            except httpx.HTTPError as e:
                error = _http_error(e, str(url))
                ec.stats.failed(error.reason)
                raise error from e
            finally:
                ec.in_flight -= 1

    async def close(self) -> None:
        """Close the client of every loop it was used on (see `close_on_their_loops`)."""
        open_clients = [(loop, c) for loop, c in self._clients.drain() if not c.is_closed]
        await close_on_their_loops(open_clients, lambda c: c.aclose(), CLOSE_TIMEOUT)


class _LastEvent:
    """Remembers the last `data:` event a plugin read from a `/generate` stream (SGLang's events are
    cumulative, so the last one holds the answer's token count), without changing what it reads."""

    def __init__(self, response: Any):
        self.response, self.last = response, None
        read = response.aiter_lines

        async def aiter_lines() -> AsyncIterator[str]:
            async for line in read():
                if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
                    self.last = line[5:]
                yield line

        response.aiter_lines = aiter_lines

    def tokens(self) -> int:
        try:
            return output_token_count(json.loads(self.last)) if self.last else 0
        except ValueError:
            return 0


def _http_error(e: Exception, url: str) -> HttpError:
    import httpx

    if isinstance(e, httpx.HTTPStatusError):
        status = e.response.status_code
        return HttpError(f"POST {url}: HTTP {status} on a streamed request", status=status)
    kind = "timeout" if isinstance(e, httpx.TimeoutException) else "connection"
    return HttpError(f"POST {url}: {type(e).__name__} on a streamed request: {e}", reason=kind)
