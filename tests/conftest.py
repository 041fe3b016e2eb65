"""Shared fixtures: hermetic environment (no hub, offline wandb, loopback only), one Ray
cluster per test session, and the tiny model."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# One directory per test process: with `make test WORKERS=N` (pytest-xdist) each worker has its own (wandb's
# directories, the fork server's log), also when SLIME_TEST_WORKDIR names one for the whole run.
_WORK = (
    Path(os.environ["SLIME_TEST_WORKDIR"]) / os.environ.get("PYTEST_XDIST_WORKER", "main")
    if os.environ.get("SLIME_TEST_WORKDIR")
    else Path(tempfile.mkdtemp(prefix="slime-test-"))
)
_WORK.mkdir(parents=True, exist_ok=True)

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
for var, sub in (
    ("WANDB_DIR", "wandb"),
    ("WANDB_CACHE_DIR", "wandb-cache"),
    ("WANDB_DATA_DIR", "wandb-data"),
    ("WANDB_CONFIG_DIR", "wandb-config"),
):
    os.environ.setdefault(var, str(_WORK / sub))

# A non-interactive shell starts background commands with SIGINT ignored, and an ignored signal is
# inherited through exec: run that way, every command the Ctrl-C tests start ignored their SIGINT and
# ran on (three failures in one run, none in the product). They need SIGINT as a terminal delivers it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# Hypothesis draws the same examples on every run of the suite (the "ci" profile, the default): a suite
# that gates a submission must not fail on an example one run happens to draw. `make test-explore`
# (HYPOTHESIS_PROFILE=explore) draws fresh ones; a failure it finds becomes an `@example` here.
def _hypothesis_profiles() -> None:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci",
        derandomize=True,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile(
        "explore", derandomize=False, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


_hypothesis_profiles()


def pytest_collection_modifyitems(items):
    """Runs after pytest-randomly's shuffle (a hook wrapper): each folder's files together, so the package
    fixtures of tests/weight_sync are set up once (slime/testing/suite_order.py)."""
    from slime.testing.suite_order import group_by_folder

    items[:] = group_by_folder(items)


@pytest.hookimpl(optionalhook=True)  # (a hook of pytest-xdist: unknown when it is not loaded)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` hands a worker each sub-folder of tests/ whole (slime/testing/suite_order.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from slime.testing.suite_order import folder_scheduler

    return folder_scheduler(config, log)


@pytest.fixture(scope="session")
def work_dir() -> Path:
    return _WORK


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen2 with the real Qwen3 chat tokenizer (see slime/testing/tiny_model.py)."""
    from slime.testing.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    """The tiny model's tokenizer (Qwen3's, 151k entries: a second of CPU per load), loaded once for the tests
    that only encode and decode with it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="session")
def tiny_model_b_dir(tmp_path_factory) -> Path:
    """The tiny model's architecture with other weights (seed 1): what a weight update to another model
    loads. Built once for the session (5 s of CPU each time) and only read by the tests that use it."""
    from slime.testing.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model-b"), seed=1)


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen2-VL with the Qwen3 tokenizer and a small image processor (slime/testing/tiny_model.py)."""
    from slime.testing.tiny_model import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))


@pytest.fixture(scope="session")
def engine_fork_server(tiny_model_dir, work_dir):
    """The socket of an engine fork server preloaded with the tiny model, as `slime-train` runs one
    per node: engines handed it (`RolloutManager(args, fork_server=)`, `train(args, fork_server=)`)
    start warm in under a second instead of importing torch and loading a model each (5 s idle, 50 s
    on a loaded box). None (cold starts) when `SLIME_ENGINE_FORK_SERVER=0`. Tests of the cold path
    itself do not use it."""
    from slime.ray.flags import SessionConfig
    from slime.ray.session import RaySession, _await_socket, start_engine_fork_server

    server = start_engine_fork_server(
        SessionConfig(
            rollout_backend="hf",
            hf_checkpoint=str(tiny_model_dir),
            ray_address=None,
            load_debug_rollout_data=None,
            rollout_num_engines=1,
            log_dir=str(work_dir),
        )
    )
    session = RaySession(False, server)
    try:
        yield server.socket_path if server is not None and _await_socket(server) else None
    finally:
        session.stop_fork_server()


@pytest.fixture
def fleet_of(tiny_model_dir):
    """`fleet_of(script, n)`: n scripted engines behind a real router of their own; stopped after the test."""
    from slime.testing.scripted_fleet import scripted_fleet

    with contextlib.ExitStack() as stack:
        yield lambda script, n=1: stack.enter_context(scripted_fleet([script] * n, tiny_model_dir))


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray instance for the whole session (ray.init costs ~3 s), started as slime's commands start
    theirs: without the autoscaler monitor and the dashboard's API server (slime.ray.lean_head)."""
    import ray

    from slime.ray.lean_head import lean_head
    from slime.testing.ray_start import init_with_retries

    def init():
        with lean_head():
            return ray.init(
                num_cpus=8,
                include_dashboard=False,
                _temp_dir=str(_ray_tmp()),
                runtime_env={"env_vars": _ray_env()},
                log_to_driver=False,
            )

    if not ray.is_initialized():
        init_with_retries(init, _ray_tmp())
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def train_worker_host(ray_cluster):
    """The Ray actor in whose process tests build real TrainWorkers one after another, with
    `tests.train_worker_host.in_host(host, body)`: one process start for the session, not one per test."""
    from tests.train_worker_host import TrainWorkerHost

    host = ray_cluster.remote(num_cpus=0)(TrainWorkerHost).remote()
    ray_cluster.get(host.ready.remote())
    yield host
    ray_cluster.kill(host)


def _ray_tmp() -> Path:
    # Ray's socket paths must stay short (AF_UNIX limit ~107 bytes).
    p = Path(tempfile.gettempdir()) / f"sr{os.getpid()}"
    p.mkdir(exist_ok=True)
    return p


def _ray_env() -> dict[str, str]:
    keys = (
        "RAY_AUTH_MODE",
        "HF_HUB_OFFLINE",
        "HF_ENDPOINT",
        "TRANSFORMERS_OFFLINE",
        "TOKENIZERS_PARALLELISM",
        "WANDB_MODE",
        "WANDB_DIR",
        "WANDB_CACHE_DIR",
        "WANDB_DATA_DIR",
        "WANDB_CONFIG_DIR",
        "PYTHONPATH",
    )
    env = {k: os.environ[k] for k in keys if k in os.environ}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@pytest.fixture(autouse=True)
def _fresh_rollout_runtime():
    """Every test starts without a bound rollout runtime, so none sees another's client or counters."""
    from slime.rollout.runtime import unbind

    unbind()
    yield
    unbind()


@pytest.fixture
async def runtime_closed_on_the_test_loop():
    """For async tests that send through the bound runtime on their own loop: the runtime is closed
    on that loop, before it ends (a session of an ended loop cannot be closed)."""
    from slime.rollout.runtime import bound, unbind

    yield
    runtime = bound()
    unbind()
    if runtime is not None and runtime.closing is not None:
        await runtime.closing


def native_tools_yaml(*tools: tuple[str, str, str, dict]) -> str:
    """The text of a `--tool-config-path` file: one native tool per (class_name, name, description,
    JSON-schema parameters)."""
    import yaml

    return yaml.safe_dump(
        {
            "tools": [
                {
                    "class_name": cls,
                    "config": {"type": "native"},
                    "tool_schema": {
                        "type": "function",
                        "function": {"name": name, "description": text, "parameters": params},
                    },
                }
                for cls, name, text, params in tools
            ]
        },
        sort_keys=False,
    )


class CliRuns:
    """Command lines a test starts (`python <argv>`), each in its own session with its output piped as
    text. A watchdog kills a run's whole process group once `deadline` seconds have passed (a hung run
    never hangs the suite); a run still going when the test ends is killed with its group too."""

    def __init__(self) -> None:
        self._watchdogs: dict = {}

    def start(self, argv: list[str], *, deadline: float):
        import subprocess
        import sys
        import threading

        proc = subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            start_new_session=True,
        )
        self._watchdogs[proc] = threading.Timer(deadline, _kill_group, (proc,))
        self._watchdogs[proc].start()
        return proc

    @staticmethod
    def read_until(proc, prefix: str, lines: list[str], *, anywhere: bool = False) -> None:
        """Collect `proc`'s output lines into `lines` up to the first that starts with `prefix` (with
        `anywhere`, that holds it: a Ray actor's lines come prefixed with its name and pid)."""
        for line in proc.stdout:
            lines.append(line)
            if (prefix in line) if anywhere else line.startswith(prefix):
                return
        pytest.fail(f"the command never printed {prefix!r}:\n" + "".join(lines[-40:]))

    def stop(self, proc, sig: int, timeout: float, *, read: bool = True) -> str:
        """Send `sig`, wait at most `timeout` s for the command to exit; with `read`, the rest of its
        output (to its end: children that kept it open must be gone too). The watchdog is off then."""
        proc.send_signal(sig)
        if read:
            out, _ = proc.communicate(timeout=timeout)
        else:
            proc.wait(timeout)
            proc.stdout.close()  # unread: the pipe is closed here, not left to the garbage collector
            out = ""
        self._watchdogs.pop(proc).cancel()
        return out

    def close(self) -> None:
        for proc, watchdog in self._watchdogs.items():
            watchdog.cancel()
            if proc.poll() is None:
                _kill_group(proc)
                proc.wait()
            proc.stdout.close()


def _kill_group(proc) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the whole group is gone already
        pass


@pytest.fixture
def cli_runs():
    """`cli_runs.start(argv, deadline=s)`, `.read_until`, `.stop`: see `CliRuns`."""
    runs = CliRuns()
    yield runs
    runs.close()
