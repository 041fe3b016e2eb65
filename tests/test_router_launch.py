"""The router slime starts is launched without sglang-router's Python debugging balancer (`mini_lb`: FastAPI,
uvicorn, aiohttp), and its options are read exactly as sglang-router's own launcher reads them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from slime.fleet.router import Router
from slime.fleet.router_options import router_passthrough, SLIME_SETS
from slime.cli.args import parse_args

ROOT = Path(__file__).resolve().parents[1]
USER_FLAGS = ["--router-policy", "cache_aware", "--router-cache-threshold", "0.25", "--router-log-level", "debug"]


def test_the_routers_launcher_parses_like_sglang_routers_and_imports_no_web_stack() -> None:
    extra = router_passthrough(parse_args(USER_FLAGS), taken=SLIME_SETS)
    command = Router(policy="cache_aware", extra_args=extra).command()
    module, argv = command[command.index("-m") + 1], command[command.index("-m") + 2 :]
    code = textwrap.dedent(f"""
        import dataclasses, importlib, json, sys
        launcher = importlib.import_module({module!r})
        ours = dataclasses.asdict(launcher.parse_router_args({argv!r}))
        loaded = sorted(m for m in ("sglang_router.mini_lb", "fastapi", "uvicorn", "aiohttp") if m in sys.modules)
        from sglang_router.launch_router import parse_router_args
        theirs = dataclasses.asdict(parse_router_args({argv!r}))
        print(json.dumps({{"loaded": loaded, "same": ours == theirs, "ours": ours}}, default=str))
    """)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["loaded"] == [], result["loaded"]
    assert result["same"]
    assert result["ours"]["policy"] == "cache_aware" and result["ours"]["cache_threshold"] == 0.25
    assert result["ours"]["log_level"] == "debug"


def test_a_port_taken_before_the_router_binds_it_is_not_mistaken_for_the_router(tmp_path) -> None:
    """The port `Router()` picked free is taken by another server answering `/health` (another test's engine
    does) before the router binds it: the router fails to bind and exits, the other server's 200 must not make
    it "ready", and the router starts on ports picked again (as it picked them itself)."""
    import socket

    import requests

    from slime.testing.port_squatter import squatting
    from slime.utils.child_process import listens_on

    router = Router(log_dir=str(tmp_path))
    taken = router.port
    with squatting(taken):
        assert listens_on(os.getpid(), taken) is True and requests.get(f"http://127.0.0.1:{taken}/health").ok
        router.start()
        try:
            assert router.port != taken and listens_on(router.pid, router.port) is True
            assert listens_on(router.pid, taken) is False
            assert router.list_workers() == []  # the router's own /workers answers
            assert "Address already in use" in (tmp_path / f"router-{taken}.log").read_text()
        finally:
            router.stop()
    with socket.socket() as s:  # a process that is gone: nothing to tell
        s.bind(("127.0.0.1", 0))
        assert listens_on(2**22 + 7, s.getsockname()[1]) is None
