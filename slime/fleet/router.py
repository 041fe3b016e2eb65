"""The real sglang-router, as a supervised child process.

Start-up is probed (`/health` until it answers from the router's own process, with a deadline)
rather than slept through; ports it picked itself and found taken when it binds are picked again.
Workers are registered with `POST /workers` and only counted once the router reports them
healthy. A watcher thread blocks on the process and restarts it (same port, same workers) if it
dies, so a router crash costs in-flight requests one retry, not the run.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

import requests

from slime.fleet.flags import DEFAULT_ROUTER_HEALTH_CHECK_INTERVAL
from slime.fleet.router_answer import BadRouterAnswer, Worker, parse_workers
from slime.utils.misc import find_free_port
from slime.utils.child_process import ChildProcess, ReadinessError, http_ok, start_picking_ports, wait_until

logger = logging.getLogger(__name__)


class RouterError(RuntimeError):
    """The router refused a worker."""


def _router_env() -> dict[str, str]:
    env = dict(os.environ)
    # The router fetches a tokenizer from the hub for non-local model paths; never let it.
    env.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
    env.setdefault("HF_HUB_OFFLINE", "1")
    # its launcher is ours (slime.fleet.router_launch): this checkout importable, after whatever the user's path has
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), root]))
    return env


def list_workers(router_url: str, bad_answers: Counter | None = None) -> list[Worker]:
    """The router's workers, its answer checked (`router_answer`): an error status or a body of
    another shape raises `BadRouterAnswer` (URL, field, excerpt), counted in `bad_answers` by reason."""
    r = requests.get(f"{router_url}/workers", timeout=5)
    try:
        if r.status_code != 200:
            raise BadRouterAnswer(router_url, "status", f"HTTP {r.status_code}", r.content)
        return parse_workers(r.content, router_url)
    except BadRouterAnswer as e:
        if bad_answers is not None:
            bad_answers[e.reason] += 1
        raise


def worker_healthy(router_url: str, worker_url: str, bad_answers: Counter | None = None) -> bool:
    return any(w.url == worker_url and w.healthy for w in list_workers(router_url, bad_answers))


def register_worker(
    router_url: str,
    worker_url: str,
    timeout: float = 60.0,
    proc: subprocess.Popen | None = None,
    log_path: Path | None = None,
    bad_answers: Counter | None = None,
) -> None:
    """`POST /workers` (asynchronous in sglang-router 0.3.x), then wait until it reports the worker healthy."""
    r = requests.post(f"{router_url}/workers", json={"url": worker_url}, timeout=10)
    if r.status_code not in (200, 201, 202):
        raise RouterError(f"router {router_url} refused worker {worker_url}: HTTP {r.status_code} {r.text[:500]}")
    wait_until(
        lambda: worker_healthy(router_url, worker_url, bad_answers),
        timeout,
        f"worker {worker_url} healthy in router",
        proc,
        log_path,
    )


def unregister_worker(router_url: str, worker_url: str, bad_answers: Counter | None = None) -> bool:
    """Remove a worker (a dead engine) so no request is routed to it; True if the router had it."""
    found = False
    for w in list_workers(router_url, bad_answers):
        if w.url == worker_url and w.id is not None:
            requests.delete(f"{router_url}/workers/{w.id}", timeout=10).raise_for_status()
            found = True
    return found


class Router:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        policy: str = "round_robin",
        prometheus_port: int | None = None,
        health_check_interval: int = DEFAULT_ROUTER_HEALTH_CHECK_INTERVAL,
        extra_args: list[str] | None = None,
        log_dir: str | None = None,
        startup_timeout: float = 60.0,
    ):
        self.host = host
        self.port = port or find_free_port(host)
        self.policy = policy
        self.prometheus_port = prometheus_port or find_free_port("127.0.0.1")
        self._ports_chosen = port is None and prometheus_port is None  # ours to pick again if taken (`start`)
        self.health_check_interval = health_check_interval
        self.extra_args = list(extra_args or [])
        self.startup_timeout = startup_timeout
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="slime-router-"))
        self.log_path = self.log_dir / f"router-{self.port}.log"
        self.workers: list[str] = []
        self.restarts = 0
        self.bad_answers: Counter = Counter()  # `/workers` answers refused, by reason (router_answer)
        self._process: ChildProcess | None = None
        self._stopping = threading.Event()
        self._lock = threading.RLock()
        self._watcher: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "slime.fleet.router_launch",  # sglang-router's launcher without its debugging balancer's imports
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--policy",
            self.policy,
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(self.prometheus_port),
            "--health-check-interval-secs",
            str(self.health_check_interval),
            "--health-failure-threshold",
            "2",
            "--disable-retries",
            "--log-level",
            "warn",
            *self.extra_args,
        ]

    def start(self) -> "Router":
        self._stopping.clear()
        start_picking_ports(self._spawn, self._pick_ports_again)
        self._watcher = threading.Thread(target=self._watch, name=f"router-watch-{self.port}", daemon=True)
        self._watcher.start()
        return self

    def _pick_ports_again(self) -> bool:
        """Ports picked free here and taken before the router bound them: others (never the user's)."""
        if not self._ports_chosen:
            return False
        logger.warning(
            "sglang-router: port %d or %d was taken meanwhile; picking others", self.port, self.prometheus_port
        )
        self.port, self.prometheus_port = find_free_port(self.host), find_free_port("127.0.0.1")
        self.log_path = self.log_dir / f"router-{self.port}.log"
        return True

    def _spawn(self) -> None:
        with self._lock:
            self._process = ChildProcess(
                self.command(),
                name=f"sglang-router at {self.url}",
                log_path=self.log_path,
                env=_router_env(),
                ready=http_ok(f"{self.url}/health"),
                startup_timeout=self.startup_timeout,
                port=self.port,  # /health counts from our router only: another process may hold the port
            ).start()
            for w in self.workers:
                self._register(w)

    def _watch(self) -> None:
        """Block on the router process; bring it back if it dies while we still need it."""
        while not self._stopping.is_set():
            process = self._process
            code = process.wait()
            if self._stopping.is_set():
                return
            self.restarts += 1
            logger.warning(
                "sglang-router (pid %s) exited with %s; restarting (restart #%d)", process.pid, code, self.restarts
            )
            try:
                self._spawn()
            except (ReadinessError, requests.RequestException) as e:
                logger.error("router restart failed: %s", e)
                return

    def add_worker(self, url: str, timeout: float = 60.0) -> None:
        with self._lock:
            self._register(url, timeout)
            if url not in self.workers:
                self.workers.append(url)

    def _register(self, url: str, timeout: float = 60.0) -> None:
        register_worker(
            self.url, url, timeout, self._process.proc if self._process else None, self.log_path, self.bad_answers
        )

    def list_workers(self) -> list[Worker]:
        return list_workers(self.url, self.bad_answers)

    def worker_healthy(self, url: str) -> bool:
        return worker_healthy(self.url, url, self.bad_answers)

    def remove_worker(self, url: str) -> None:
        """Forget the worker (not re-registered after a restart) and remove it from the router."""
        with self._lock:
            if url in self.workers:
                self.workers.remove(url)
            unregister_worker(self.url, url, self.bad_answers)

    def alive(self) -> bool:
        return self._process is not None and self._process.alive()

    def stop(self) -> None:
        """The router is stopped once nothing will be sent through it again (the fleet's end, or its host's),
        so there is nothing to drain: it is killed, not asked. Its graceful shutdown took 0.6-1.0 s with no
        request in flight, most of it waiting (0.16 s of CPU), and was the longest step of a command's exit."""
        self._stopping.set()
        with self._lock:
            process = self._process
        if process is not None:
            process.kill()
