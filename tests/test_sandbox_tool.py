"""SandboxFusionTool: what the model sees, what it may not change, retries, back-off, no leaks."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from slime.tools.sandbox_fusion_tool import SandboxFusionTool
from slime.tools.schemas import OpenAIFunctionToolSchema

ROOT = Path(__file__).resolve().parents[1]


def schema(name="code_interpreter", extra_props=None) -> OpenAIFunctionToolSchema:
    props = {"code": {"type": "string", "description": "code"}, **(extra_props or {})}
    return OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": name,
                "description": "run code",
                "parameters": {"type": "object", "properties": props, "required": ["code"]},
            },
        }
    )


@pytest.fixture(scope="module")
def sandbox_url():
    from slime.sandbox.server import start_local_sandbox
    from tests.test_sandbox import ISOLATED

    url, handle = start_local_sandbox(max_concurrency=4, allow_no_isolation=not ISOLATED)
    yield url
    handle.stop()


def make(url, sch=None, **cfg) -> SandboxFusionTool:
    base = {"sandbox_fusion_url": url, "enable_global_rate_limit": False, "rate_limit": 4, "default_timeout": 5}
    return SandboxFusionTool({**base, **cfg}, sch or schema())


@pytest.fixture
async def tools():
    """`tools(url, sch=None, **cfg)`: `make`, and each tool made is closed (its HTTP session) on the
    test's own loop when the test ends."""
    made: list[SandboxFusionTool] = []

    def build(url, sch=None, **cfg) -> SandboxFusionTool:
        made.append(make(url, sch, **cfg))
        return made[-1]

    yield build
    for tool in made:
        await tool.close()


async def ex(tool, params):
    iid, _ = await tool.create()
    try:
        resp, reward, metrics = await tool.execute(iid, params)
        return resp.text, metrics
    finally:
        await tool.release(iid)


async def test_outputs_are_explicit(sandbox_url, tools):
    tool = tools(sandbox_url)
    text, m = await ex(tool, {"code": "print(6*7)"})
    assert text == "42\n" and m["status"] == "success"
    text, m = await ex(tool, {"code": "x = 1"})
    assert text == "(the code ran successfully and printed nothing)"
    text, m = await ex(tool, {"code": "print('partial')\nraise SystemExit(3)"})
    assert text.startswith("Runtime error (exit code 3).") and "partial" in text and m["exit_code"] == 3
    text, m = await ex(tool, {"code": "print('a')\n1/0"})
    assert "Runtime error (exit code 1)" in text and "ZeroDivisionError" in text and "stdout:\na" in text
    text, m = await ex(
        tools(sandbox_url, default_timeout=0.5), {"code": "import time\nprint('t', flush=True)\ntime.sleep(20)"}
    )
    assert text.startswith("Timeout: the code did not finish within 0.5s") and "t\n" in text
    assert m["status"] == "timeout"
    text, m = await ex(tool, {"code": ""})
    assert text.startswith("Error: `code` must be a non-empty string") and m["status"] == "bad_arguments"
    text, m = await ex(tool, {"code": "print('x' * 50000)"})
    assert "characters omitted" in text and len(text) < 9000


async def test_model_cannot_raise_timeout_or_switch_language(sandbox_url, tools):
    tool = tools(sandbox_url, default_timeout=0.5)  # schema offers neither `timeout` nor `language`
    text, m = await ex(tool, {"code": "import time; time.sleep(3); print('late')", "timeout": 100, "language": "bash"})
    assert m["status"] == "timeout" and "late" not in text
    text, m = await ex(tool, {"code": "echo hi", "language": "bash"})  # still python: a syntax error
    assert "SyntaxError" in text
    offered = schema(extra_props={"language": {"type": "string"}, "timeout": {"type": "number"}})
    tool = tools(sandbox_url, offered, default_timeout=0.5, max_timeout=1, allowed_languages=["python", "bash"])
    text, m = await ex(tool, {"code": "echo hi", "language": "bash"})
    assert text == "hi\n"
    text, m = await ex(tool, {"code": "int main(){}", "language": "cpp"})
    assert "not available" in text and m["status"] == "bad_arguments"
    text, m = await ex(tool, {"code": "import time; time.sleep(5)", "timeout": 100})
    # the asked 100 s would have let the 5 s sleep finish: a timeout naming 1 s is max_timeout's (no clock read)
    assert m["status"] == "timeout" and "within 1s" in text


async def test_unreachable_sandbox_is_a_clear_error_and_releases_permits(tools):
    tool = tools("http://127.0.0.1:9", max_retries=2, retry_base_delay=0.01)
    text, m = await ex(tool, {"code": "print(1)"})
    assert text.startswith("Sandbox error: the sandbox failed after 3 attempt(s)") and "connection" in text
    assert text.endswith("; the code was not run.")  # (refused: nothing reached the sandbox)
    assert m["status"] == "sandbox_unreachable" and m["retries"] == 2
    lim = next(iter(tool._local.values()))
    assert lim.inflight == 0 and lim.n_waiting == 0


class FakeSandbox:
    """429 (with Retry-After) / 500 a few times, then success; counts concurrent requests."""

    def __init__(self, n429=0, n500=0, retry_after=0.2):
        self.n429, self.n500, self.retry_after = n429, n500, retry_after
        self.calls, self.cur, self.max = [], 0, 0

    async def handle(self, request):
        self.calls.append(time.monotonic())
        self.cur += 1
        self.max = max(self.max, self.cur)
        try:
            await asyncio.sleep(0.02)
            if self.n429:
                self.n429 -= 1
                return web.json_response(
                    {"status": "SandboxError", "retry_after_s": self.retry_after},
                    status=429,
                    headers={"Retry-After": "1"},
                )
            if self.n500:
                self.n500 -= 1
                return web.Response(status=503, text="restarting")
            body = await request.json()
            return web.json_response(
                {
                    "status": "Success",
                    "message": "",
                    "compile_result": None,
                    "files": {},
                    "run_result": {
                        "status": "Finished",
                        "return_code": 0,
                        "execution_time": 0.01,
                        "stdout": f"ran {body['language']}\n",
                        "stderr": "",
                    },
                }
            )
        finally:
            self.cur -= 1


async def serve(fake):
    app = web.Application()
    app.router.add_post("/run_code", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


async def test_429_backoff_honours_retry_after_and_cuts_the_limiter(tools):
    fake = FakeSandbox(n429=2, retry_after=0.2)
    runner, url = await serve(fake)
    try:
        tool = tools(url, max_retries=4, retry_base_delay=0.001)
        text, m = await ex(tool, {"code": "print(1)"})
        assert text == "ran python\n" and m["retries"] == 2
        gaps = [b - a for a, b in zip(fake.calls, fake.calls[1:])]
        assert all(g >= 0.2 for g in gaps), gaps  # Retry-After (0.2 s from the body) honoured
        lim = next(iter(tool._local.values()))
        assert lim.throttled_count == 2 and lim.inflight == 0
        assert (await lim.global_stats())["aimd_cuts"] >= 1
        assert tool.stats["retries_429"] == 2
    finally:
        await runner.cleanup()


async def test_5xx_retried_within_budget_then_clear_error(tools):
    fake = FakeSandbox(n500=10)
    runner, url = await serve(fake)
    try:
        tool = tools(url, max_retries=2, retry_base_delay=0.001)
        text, m = await ex(tool, {"code": "print(1)"})
        assert len(fake.calls) == 3 and "HTTP 503" in text and text.startswith("Sandbox error")
        assert text.endswith("; the code may have run.")  # (a 5xx: the sandbox got the request)
        fake.n500 = 1
        text, m = await ex(tool, {"code": "print(1)"})
        assert text == "ran python\n" and m["retries"] == 1
    finally:
        await runner.cleanup()


async def test_local_limit_caps_concurrency(tools):
    fake = FakeSandbox()
    runner, url = await serve(fake)
    try:
        tool = tools(url, rate_limit=3, enable_global_rate_limit=False)
        iid, _ = await tool.create()
        res = await asyncio.gather(*[tool.execute(iid, {"code": "print(1)"}) for _ in range(30)])
        assert all(r[0].text == "ran python\n" for r in res)
        assert fake.max == 3
    finally:
        await runner.cleanup()


async def _degrades_to_local() -> None:
    import ray

    assert not ray.is_initialized()
    fake = FakeSandbox()
    runner, url = await serve(fake)
    tool = make(url, enable_global_rate_limit=True, rate_limit=2)
    try:
        iid, _ = await tool.create()
        res = await asyncio.gather(*[tool.execute(iid, {"code": "print(1)"}) for _ in range(10)])
        assert all(r[0].text == "ran python\n" for r in res) and fake.max <= 2
        assert fake.max == 2  # the local limit was reached, not just respected by accident
    finally:
        await tool.close()
        await runner.cleanup()


def test_global_limit_without_ray_degrades_to_local():
    """Runs in a fresh interpreter: Ray is up in this test session, and the point is its absence."""
    import subprocess
    import sys

    code = (
        "import asyncio, sys; sys.path.insert(0, sys.argv[1]); "
        "from tests.test_sandbox_tool import _degrades_to_local; asyncio.run(_degrades_to_local())"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]


async def test_local_url_uses_managers_sandbox(sandbox_url, tools):
    from slime.tools.services import ToolServices

    tool = tools("local")
    tool.use_services(ToolServices(sandbox_url=sandbox_url))  # what the manager hands down
    text, _ = await ex(tool, {"code": "print('via local')"})
    assert text == "via local\n" and tool._url == sandbox_url


def test_yaml_config_builds_the_tool():
    from slime.tools.registry import load_tool_config

    cfg = yaml.safe_load((ROOT / "configs" / "sandbox_fusion_tool.yaml").read_text())
    entry = cfg["tools"][0]
    assert entry["class_name"] == "slime.tools.sandbox_fusion_tool.SandboxFusionTool"
    for key in (
        "sandbox_fusion_url",
        "num_workers",
        "rate_limit",
        "default_timeout",
        "default_language",
        "enable_global_rate_limit",
        "memory_limit_mb",
        "rate_limit_per_second",
        "max_retries",
    ):
        assert key in entry["config"], key
    ts = load_tool_config(ROOT / "configs" / "sandbox_fusion_tool.yaml")
    try:
        tool = ts["code_interpreter"]
        assert isinstance(tool, SandboxFusionTool) and tool.url_cfg == "local"
        assert json.dumps(ts.schemas())
    finally:
        import ray

        if ray.is_initialized():  # do not leave a detached limiter for other tests
            from slime.tools.rate_limiter import kill_rate_limiter

            kill_rate_limiter("tool:code_interpreter")


def test_a_sandbox_error_says_whether_the_code_ran():
    """Issue 21: "the code was not run" only when the sandbox says so; ours says which, others may not."""
    tool = make("http://127.0.0.1:9")

    def fmt(message):
        return tool._format({"status": "SandboxError", "message": message}, 1.0, {})

    assert (
        fmt("the sandbox server stopped this run; the code may have run")
        == "Sandbox error: the sandbox server stopped this run; the code may have run."
    )
    assert (
        fmt("the memory limit of 32 MB could not be applied (busy); the code was not run")
        == "Sandbox error: the memory limit of 32 MB could not be applied (busy); the code was not run."
    )
    assert fmt("internal error") == "Sandbox error: internal error; the code may not have run."
