"""A command's exit stops what it started in order without waiting out anyone's timeout (issue 31: the
exit took 2.4-4 s after the last line; bench/bench_cold_start.py's exit timeline says where it went):
the router is killed, not drained (nothing goes through it any more); every engine is asked to stop
before any is waited for (Ray's autoscaler monitor, which sat out `ray.shutdown()`'s SIGTERM for 1 s, is no
longer started: tests/test_lean_head.py). What is left after the whole exit (no process, no temp dir,
no shared memory) is tests/test_group_sigterm.py's."""

from __future__ import annotations

import signal
import sys
import threading
from types import SimpleNamespace

from slime.utils.child_process import ChildProcess

# sits out a SIGTERM as a server draining its requests would, and says when it is ready to
IGNORES_SIGTERM = (
    "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0) if len(sys.argv) > 1 "
    "else None)\nprint('ready', flush=True)\ntime.sleep(600)\n"
)


def _ready(path) -> bool:
    return path.exists() and "ready" in path.read_text()


def test_the_router_is_killed_not_drained(tmp_path):
    """A router that would end cleanly on SIGTERM (exit 0) after draining is killed at once: SIGKILL's code."""
    from slime.fleet.router import Router

    router = Router(log_dir=str(tmp_path))
    log = tmp_path / "fake-router.log"
    router._process = ChildProcess(
        [sys.executable, "-c", IGNORES_SIGTERM, "drain-then-exit-0"],
        name="fake router",
        log_path=log,
        ready=lambda: _ready(log),
    ).start()
    router.stop()
    assert router._process.proc.returncode == -signal.SIGKILL
    assert not router.alive()


def test_every_engine_is_asked_to_stop_before_any_is_waited_for(ray_cluster):
    """Each engine's stop returns only once every engine has been asked (a barrier): asked and waited for one
    after the other, the first engine's stop would wait for the second's request that never came."""
    import ray

    from slime.fleet.fleet import Fleet

    @ray.remote(num_cpus=0)
    class Barrier:
        def __init__(self, n: int):
            self.arrived, self.n = 0, n
            self.all_in = threading.Event()

        def arrive(self) -> None:
            self.arrived += 1
            if self.arrived == self.n:
                self.all_in.set()

        def wait(self, timeout: float) -> bool:
            return self.all_in.wait(timeout)

    @ray.remote(num_cpus=0, max_concurrency=2)
    class Engine:
        def __init__(self, barrier):
            self.barrier = barrier

        def stop(self) -> None:
            ray.get(self.barrier.arrive.remote())
            if not ray.get(self.barrier.wait.remote(20)):
                raise RuntimeError("stopped before every engine was asked to")

    barrier = Barrier.options(max_concurrency=4).remote(2)
    slots = [SimpleNamespace(rank=r, state="healthy", actors=[Engine.remote(barrier)]) for r in range(2)]
    fleet = SimpleNamespace(stopping=threading.Event(), router=None, slots=slots, pg=None)
    failed = []
    for what, step in Fleet.stop_steps(fleet):
        try:
            step()
        except Exception as e:  # noqa: BLE001 - the test names the step that failed
            failed.append(f"{what}: {e}")
    assert failed == []
    assert fleet.stopping.is_set() and [s.state for s in slots] == ["stopped", "stopped"]
    ray.kill(barrier)
