"""The seed design (REFERENCE §4, seeds/001), reproduced for comparison only.

A Ray actor wrapping a threading semaphore (`acquire` in a one-thread concurrency group,
`release` in another), and a per-process threaded `ExecutionWorker` actor that takes the
permit with a blocking `ray.get`, runs the function and releases with a fire-and-forget call:
three Ray hops per guarded call. Not used by slime; `bench_rate_limiter.py` measures it.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import ray


@ray.remote(concurrency_groups={"acquire": 1, "release": 10}, num_cpus=0)
class SeedTokenBucketWorker:
    def __init__(self, rate_limit: int) -> None:
        self.rate_limit = rate_limit
        self.current_count = 0
        self._sem = threading.Semaphore(rate_limit)

    @ray.method(concurrency_group="acquire")
    def acquire(self) -> None:
        self._sem.acquire()
        self.current_count += 1

    @ray.method(concurrency_group="release")
    def release(self) -> None:
        self._sem.release()
        self.current_count -= 1

    def get_current_count(self) -> int:
        return self.current_count


class SeedExecutionWorker:
    def __init__(self, rate_limit: int, name: str = "seed-rate-limiter") -> None:
        # as in the seed: every pool asks for the same name; whoever comes first sets the limit
        self.bucket = SeedTokenBucketWorker.options(name=name, get_if_exists=True).remote(rate_limit)

    def execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            ray.get(self.bucket.acquire.remote())
            try:
                return fn(*args, **kwargs)
            except Exception:  # the seed swallows errors into None
                return None
        finally:
            self.bucket.release.remote()


def init_seed_pool(num_workers: int, rate_limit: int, name: str = "seed-rate-limiter"):
    return ray.remote(SeedExecutionWorker).options(max_concurrency=num_workers, num_cpus=0).remote(rate_limit, name)
