"""The Ray actor process in which tests build real `TrainWorker`s, one after another (tests/conftest.py's
`train_worker_host` fixture, one for the session).

A `TrainWorker` actor of its own per test costs a process that imports torch and transformers (10-20 s on a
loaded 2-core box) for a step that takes well under a second. Here each test's worker is still built as
slime-train builds it (`TrainWorker(WorkerConfig.from_args(args), args, 1, 0)` and `init`: model loaded, optimizer and loss hooks built
from its own args, seeded), in a Ray actor's process as slime-train runs it; only the process, and the gloo
group of one rank it joined once (`init` joins only when there is none), are shared. Freeing a gloo group is
never needed (in the test process it can deadlock: tests/test_nonfinite_training.py).
"""

from __future__ import annotations

from typing import Any, Callable


class TrainWorkerHost:
    """Joins the one-rank gloo group when created; `make_worker` builds an initialised TrainWorker there."""

    def __init__(self) -> None:
        import datetime

        import torch.distributed as dist

        from slime.utils.misc import find_free_port

        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{find_free_port('127.0.0.1')}",
            rank=0,
            world_size=1,
            timeout=datetime.timedelta(seconds=300),
        )

    def ready(self) -> bool:
        return True


def make_worker(argv: list[str]) -> Any:
    """Run in the host: a `TrainWorker` of `slime-train argv`, initialised (the group is up: not joined again)."""
    from slime.cli.train import parse_train_args
    from slime.train.flags import WorkerConfig
    from slime.train.worker import TrainWorker

    args = parse_train_args(argv)
    worker = TrainWorker(WorkerConfig.from_args(args), args, 1, 0)
    worker.init("127.0.0.1", 0)
    return worker


def in_host(host: Any, body: Callable[[Callable[[list[str]], Any]], Any]) -> Any:
    """`body(make_worker)` run in the host's process; its return value (an exception it raises, raised here)."""
    import ray

    return ray.get(host.__ray_call__.remote(lambda _host: body(make_worker)))
