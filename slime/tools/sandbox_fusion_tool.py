"""`code_interpreter`: run the model's code in a SandboxFusion-compatible sandbox.

Config (verl keys first):
  sandbox_fusion_url        URL of the sandbox, or `local` (the `slime-sandbox` the RolloutManager
                            started for the run, handed over in ToolServices; without a manager,
                            one started on demand for this process)
  num_workers               concurrent executions per process (default 32)
  rate_limit                global concurrent executions (default 10)
  default_timeout           run timeout in seconds (default 30)
  default_language          (default "python")
  enable_global_rate_limit  one Ray limiter for the whole cluster (default true); false = per process
  memory_limit_mb           (default 1024)
  rate_limit_per_second     global executions per second (default: no rate), with
  rate_limit_burst          burst (default: one second's worth)
  max_retries               retries of 429 / 5xx / connection errors (default 3)
Extra: allowed_languages (default [default_language]), max_timeout (default default_timeout),
limiter_name (default "tool:<tool name>"), acquire_timeout (default 600), max_output_chars (default
8000), retry_base_delay (0.1), retry_max_delay (10).

The model may pass `language`/`timeout` only if the tool schema offers them, and then only within
`allowed_languages` / `max_timeout`. What the model sees always states what happened: the output,
or "Runtime error (exit code N)", "Timeout after Ns", "Compilation error", "Sandbox error: ...".
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import random
import threading
import time
from typing import Any
from uuid import uuid4

import aiohttp

from slime.tools.base_tool import BaseTool
from slime.tools.rate_limiter import (
    RateLimiter,
    RateLimiterUnavailable,
    RateLimitTimeout,
    client_for,
    get_or_create_rate_limiter,
    get_rate_limiter,
    local_rate_limiter,
)
from slime.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from slime.tools.services import ToolServices
from slime.utils.http_retry import HttpClient

logger = logging.getLogger(__name__)

# Without a manager (a tool used by hand, a unit test) the process starts its own sandbox on first use.
# Explicit per-process cache: key is the process; cleared when that sandbox dies.
_local_lock = threading.Lock()
_local_sandbox: tuple[str, Any] | None = None


def local_sandbox_url() -> str:
    """This process's own sandbox for `sandbox_fusion_url: local`, started on first use."""
    global _local_sandbox
    with _local_lock:
        if _local_sandbox is None or not _local_sandbox[1].alive():
            from slime.sandbox.server import start_local_sandbox

            url, handle = start_local_sandbox()
            atexit.register(handle.stop)
            _local_sandbox = (url, handle)
        return _local_sandbox[0]


def rate_limiter_spec(config: dict[str, Any], tool_name: str) -> dict[str, Any]:
    """The global limiter a SandboxFusionTool with this config uses (kwargs of
    `get_or_create_rate_limiter`), so the manager can create it before any worker touches it."""
    rps = config.get("rate_limit_per_second")
    burst = config.get("rate_limit_burst")
    return {
        "name": str(config.get("limiter_name") or f"tool:{tool_name}"),
        "max_concurrency": int(config.get("rate_limit", 10)),
        "rate_per_second": float(rps) if rps else None,
        "burst": int(burst) if burst else None,
    }


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None, throttled: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.retry_after, self.throttled = reason, retry_after, throttled


class SandboxFusionTool(BaseTool):
    @classmethod
    def start_shared_services(
        cls, name: str, config: dict[str, Any], services: ToolServices, handles: list[Any]
    ) -> None:
        """The run's local sandbox (once, for `sandbox_fusion_url: local`) and this tool's global limiter."""
        if str(config.get("sandbox_fusion_url") or "local") == "local" and services.sandbox_url is None:
            from slime.sandbox.server import start_local_sandbox

            services.sandbox_url, handle = start_local_sandbox()
            handles.append(handle)
        if config.get("enable_global_rate_limit", True):
            spec = rate_limiter_spec(config, name)
            limiter = spec.pop("name")
            if limiter not in services.limiter_names:
                handles.append(get_or_create_rate_limiter(limiter, **spec))  # kept referenced: Ray keeps it alive
                services.limiter_names.append(limiter)

    def use_services(self, services: ToolServices) -> None:
        if self.url_cfg == "local" and services.sandbox_url:
            self._url = services.sandbox_url.rstrip("/")

    def service_urls(self) -> dict[str, str]:
        """The configured sandbox (`local` is started by the run itself: nothing to check)."""
        return {} if self.url_cfg == "local" else {"sandbox_fusion_url": self.url_cfg}

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)
        self._http = HttpClient()
        c = self.config
        self.url_cfg = str(c.get("sandbox_fusion_url") or "local")
        self._url: str | None = None if self.url_cfg == "local" else self.url_cfg.rstrip("/")
        self.num_workers = int(c.get("num_workers", 32))
        self.rate_limit = int(c.get("rate_limit", 10))
        self.default_timeout = float(c.get("default_timeout", 30))
        self.max_timeout = float(c.get("max_timeout", self.default_timeout))
        self.default_language = str(c.get("default_language", "python"))
        self.allowed_languages = [str(x) for x in c.get("allowed_languages") or [self.default_language]]
        self.enable_global = bool(c.get("enable_global_rate_limit", True))
        self.memory_limit_mb = int(c.get("memory_limit_mb", 1024))
        rps = c.get("rate_limit_per_second")
        self.rate_per_second = float(rps) if rps else None
        burst = c.get("rate_limit_burst")
        self.burst = int(burst) if burst else None
        self.max_retries = int(c.get("max_retries", 3))
        self.acquire_timeout = float(c.get("acquire_timeout", 600))
        self.max_output_chars = int(c.get("max_output_chars", 8000))
        self.retry_base_delay = float(c.get("retry_base_delay", 0.1))
        self.retry_max_delay = float(c.get("retry_max_delay", 10.0))
        self.limiter_name = str(c.get("limiter_name") or f"tool:{self.name}")
        props = tool_schema.function.parameters.properties
        self.offers_language = "language" in props
        self.offers_timeout = "timeout" in props
        self._instances: dict[str, dict[str, Any]] = {}
        self._handle = None
        self._local: dict[int, RateLimiter] = {}
        self._per_process: dict[int, asyncio.Semaphore] = {}
        self.stats: dict[str, int] = {}
        if self.enable_global:
            self._handle = self._global_handle()

    # -- limiter -------------------------------------------------------------------------
    def _global_handle(self):
        try:
            import ray

            if not ray.is_initialized():
                logger.warning("%s: Ray is not initialised; using a per-process rate limit", self.name)
                return None
        except ImportError:
            return None
        spec = rate_limiter_spec(self.config, self.name)
        assert spec["name"] == self.limiter_name
        spec.pop("name")
        # The manager normally created it (start_shared_services) and owns it. A worker that
        # finds none creates it detached, so it does not die with this worker. Either way a
        # different limit under the same name raises RateLimiterConfigError.
        detached = get_rate_limiter(self.limiter_name) is None
        return get_or_create_rate_limiter(self.limiter_name, detached=detached, **spec)

    def _limiter(self) -> RateLimiter:
        loop_id = id(asyncio.get_running_loop())
        if self._handle is not None:
            try:
                c = client_for(self.limiter_name, self._handle)
                if c.broken is None:
                    return c
            except Exception as e:  # noqa: BLE001 - degrade, never crash the rollout
                logger.error("%s: global limiter unavailable (%s); falling back to a local limit", self.name, e)
            self._handle = None
            self._count("limiter_degraded")
        lim = self._local.get(loop_id)
        if lim is None:
            lim = self._local[loop_id] = local_rate_limiter(
                self.rate_limit, self.rate_per_second, self.burst, name=self.limiter_name
            )
        return lim

    def _count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    # -- lifecycle -----------------------------------------------------------------------
    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        iid = instance_id or str(uuid4())
        self._instances[iid] = {"calls": 0, "outputs": []}
        return iid, ToolResponse()

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)

    async def close(self) -> None:
        """Close this loop's HTTP session (`ToolSet.close`, when the controller closes)."""
        await self._http.close()

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        t0 = time.monotonic()
        metrics: dict[str, Any] = {"tool": self.name}
        try:
            text = await self._execute(parameters if isinstance(parameters, dict) else {}, metrics)
        except Exception as e:  # noqa: BLE001 - the rollout must go on; say what happened
            logger.exception("%s: unexpected error", self.name)
            metrics["status"] = "tool_error"
            text = f"Sandbox error: the tool failed unexpectedly ({type(e).__name__}: {e}); the code may not have run."
        metrics["latency_s"] = time.monotonic() - t0
        self._count(f"status_{metrics.get('status', 'unknown')}")
        inst = self._instances.get(instance_id)
        if inst is not None:
            inst["calls"] += 1
            inst["outputs"].append(text)
        return ToolResponse(text=text), 0.0, metrics

    # -- the work ------------------------------------------------------------------------
    async def _execute(self, params: dict[str, Any], metrics: dict[str, Any]) -> str:
        code = params.get("code")
        if not isinstance(code, str) or not code.strip():
            metrics["status"] = "bad_arguments"
            return "Error: `code` must be a non-empty string with the code to run; nothing was executed."
        language = self.default_language
        if self.offers_language and params.get("language") not in (None, ""):
            language = str(params["language"]).lower()
            if language not in self.allowed_languages:
                metrics["status"] = "bad_arguments"
                return (
                    f"Error: language {language!r} is not available; allowed: "
                    f"{', '.join(self.allowed_languages)}. Nothing was executed."
                )
        timeout = self.default_timeout
        if self.offers_timeout and params.get("timeout") is not None:
            try:
                timeout = max(0.1, min(float(params["timeout"]), self.max_timeout))
            except (TypeError, ValueError):
                pass
        payload = {
            "code": code,
            "language": language,
            "run_timeout": timeout,
            "compile_timeout": timeout,
            "memory_limit_MB": self.memory_limit_mb,
        }
        if isinstance(params.get("stdin"), str) and "stdin" in self.tool_schema.function.parameters.properties:
            payload["stdin"] = params["stdin"]
        try:
            body = await self._call(payload, timeout, metrics)
        except RateLimitTimeout:
            metrics["status"] = "sandbox_saturated"
            return (
                f"Sandbox error: no execution slot became free within {self.acquire_timeout:.0f}s; "
                "the code was not run."
            )
        except _GiveUp as e:
            metrics["status"] = "sandbox_unreachable"
            return f"Sandbox error: {e}; the code {'may have run' if e.maybe_ran else 'was not run'}."
        return self._format(body, timeout, metrics)

    def _url_now(self) -> str:
        if self._url is None:
            self._url = local_sandbox_url().rstrip("/")
        return self._url

    async def _call(self, payload: dict[str, Any], timeout: float, metrics: dict[str, Any]) -> dict[str, Any]:
        url = self._url_now() + "/run_code"
        loop_id = id(asyncio.get_running_loop())
        sem = self._per_process.get(loop_id)
        if sem is None:
            sem = self._per_process[loop_id] = asyncio.Semaphore(self.num_workers)
        attempt, waited, maybe_ran = 0, 0.0, False  # maybe_ran: an attempt may have run the code
        http_timeout = aiohttp.ClientTimeout(total=2 * timeout + 60)
        last = ""
        async with sem:
            while True:
                limiter = self._limiter()
                t = time.monotonic()
                try:
                    await limiter.acquire(timeout=self.acquire_timeout)
                except RateLimiterUnavailable:
                    self._handle = None  # degrade to the local limit and retry at once
                    continue
                waited += time.monotonic() - t
                throttled = False
                try:
                    try:
                        async with self._http.session().post(url, json=payload, timeout=http_timeout) as resp:
                            if resp.status == 200:
                                body = await resp.json(content_type=None)
                                metrics.update(retries=attempt, limiter_wait_s=waited)
                                return body
                            text = (await resp.text())[:500]
                            if resp.status == 429:
                                throttled = True
                                raise _Retryable("HTTP 429", _retry_after(resp, text), throttled=True)
                            if resp.status >= 500:
                                maybe_ran = True
                                raise _Retryable(f"HTTP {resp.status}: {text}")
                            raise _GiveUp(f"the sandbox rejected the request (HTTP {resp.status}: {text})", maybe_ran)
                    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError) as e:
                        # (refused: nothing ran; dropped after the request was sent: it may have)
                        maybe_ran |= not isinstance(e, aiohttp.ClientConnectorError)
                        raise _Retryable(f"connection error: {type(e).__name__}: {e}") from e
                    except asyncio.TimeoutError as e:
                        maybe_ran = True
                        raise _Retryable(f"no answer within {http_timeout.total:.0f}s") from e
                except _Retryable as r:
                    last, retry_after = r.reason, r.retry_after
                    self._count("retries_429" if r.throttled else "retries_other")
                    if attempt >= self.max_retries:
                        metrics.update(retries=attempt, limiter_wait_s=waited)
                        raise _GiveUp(
                            f"the sandbox failed after {attempt + 1} attempt(s) (last: {last})", maybe_ran
                        ) from None
                finally:
                    limiter.release(throttled=throttled)  # never hold a slot while backing off
                delay = random.uniform(0, min(self.retry_max_delay, self.retry_base_delay * 2**attempt))
                await asyncio.sleep(max(delay, retry_after or 0.0))
                attempt += 1

    def _format(self, body: dict[str, Any], timeout: float, metrics: dict[str, Any]) -> str:
        status = body.get("status")
        if status == "SandboxError" or not isinstance(body, dict):
            metrics["status"] = "sandbox_error"
            msg = str(body.get("message") or "the sandbox could not run the code")
            if not msg.endswith(("the code was not run", "the code may have run")):  # (ours says which)
                msg += "; the code may not have run"
            return f"Sandbox error: {msg}."
        comp = body.get("compile_result") or None
        run = body.get("run_result") or None
        if comp and (comp.get("status") != "Finished" or comp.get("return_code") not in (0, None)):
            metrics["status"] = "compile_error"
            head = "Compilation timed out" if comp.get("status") == "TimeLimitExceeded" else "Compilation error"
            return self._join(f"{head}:", comp.get("stdout"), comp.get("stderr"))
        if not run:
            metrics["status"] = "sandbox_error"
            return f"Sandbox error: {body.get('message') or 'no run result'}."
        rs, rc = run.get("status"), run.get("return_code")
        metrics["exit_code"] = rc
        if rs == "TimeLimitExceeded":
            metrics["status"] = "timeout"
            return self._join(
                f"Timeout: the code did not finish within {timeout:g}s and was killed. Output before the timeout:",
                run.get("stdout"),
                run.get("stderr"),
                empty="(none)",
            )
        if rs == "Error":
            metrics["status"] = "runtime_error"
            return self._join(
                f"Runtime error: {body.get('message') or 'the run was stopped'}.", run.get("stdout"), run.get("stderr")
            )
        if rc not in (0, None):
            metrics["status"] = "runtime_error"
            what = f"killed by signal {-rc}" if isinstance(rc, int) and rc < 0 else f"exit code {rc}"
            return self._join(f"Runtime error ({what}).", run.get("stdout"), run.get("stderr"))
        metrics["status"] = "success"
        out, err = run.get("stdout") or "", run.get("stderr") or ""
        if not out and not err:
            return "(the code ran successfully and printed nothing)"
        if not err:
            return self._clip(out)
        return self._join("", out, err)

    def _join(self, head: str, out: str | None, err: str | None, empty: str = "") -> str:
        parts = [head] if head else []
        if out:
            parts.append("stdout:\n" + self._clip(out))
        if err:
            parts.append("stderr:\n" + self._clip(err))
        if not out and not err and empty:
            parts.append(empty)
        return "\n".join(parts)

    def _clip(self, s: str) -> str:
        n = self.max_output_chars
        if len(s) <= n:
            return s
        half = n // 2
        return f"{s[:half]}\n... [{len(s) - 2 * half} characters omitted] ...\n{s[-half:]}"


class _GiveUp(Exception):
    def __init__(self, message: str, maybe_ran: bool = False) -> None:
        super().__init__(message)
        self.maybe_ran = maybe_ran  # an attempt reached the sandbox and may have run the code


def _retry_after(resp: aiohttp.ClientResponse, text: str) -> float | None:
    try:
        import json

        v = json.loads(text).get("retry_after_s")
        if v is not None:
            return float(v)
    except Exception:  # noqa: BLE001
        pass
    try:
        return float(resp.headers.get("Retry-After", ""))
    except ValueError:
        return None
