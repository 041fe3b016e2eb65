"""`freeze_startup_heap`: the objects a rollout process holds once it is set up are left out of garbage collection.

Why: a process that runs rollouts holds a few hundred thousand long-lived objects by then (Ray, aiohttp,
the tokenizer's modules, the arguments), and each rollout allocates enough to trigger a full collection,
which walks them all: about 0.3 s per collection, 0.13-0.15 ms of the rollout path's 0.85-1.25 ms CPU per
sample in bench_rollout_overhead (measured with gc callbacks, 2,000 samples a rollout). Frozen objects are
never collected (they live as long as the process anyway); what the rollouts allocate later is collected
as before. Garbage cycles that exist at the moment of the freeze stay in memory: a bounded, one-time amount.

The same call raises the young generation's threshold (`YOUNG_THRESHOLD` net allocations between
collections, CPython's default 700): every rollout request allocates a few dozen containers that live for
the request (its sample's lists, the answer's dicts), so at 700 a young collection ran every ~12 samples
and walked the in-flight ones each time: 0.064 ms of 0.76 ms CPU per sample (timed with gc callbacks on
bench_rollout_overhead's path, 2,000 samples: 117 young + 11 middle + 1 full collection a rollout); at
10,000, 4 young collections and 0.004 ms per sample. Garbage cycles wait longer for a collection; what
refcounting frees (nearly everything) is freed at once, as before.

`collection_paused` is the same idea for a start-up that only builds what lives on (imports, a checkpoint):
the engine fork server's preload (torch, transformers, FastAPI, the model, two tokenizers) allocates ~630,000
objects that all outlive it, and young collections kept walking them: 1.7-2.1 of its 9.1-10.1 CPU seconds (the
same preload with collection off: 7.0-8.4 s; the garbage left uncollected: 8 MB of its 450 MB). CPython's own
advice for a process that forks without exec (the `gc.freeze` docs): collection off early in the parent,
freeze before the fork, so the children's collections never walk, nor copy, the parent's pages.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


YOUNG_THRESHOLD = 10_000  # net allocations between young-generation collections (see above)


def freeze_startup_heap() -> bool:
    """Freeze once per process (nothing frozen yet) and raise the young generation's threshold to
    `YOUNG_THRESHOLD` (a process that turned collection off, 0, or set a larger one keeps its own);
    True if this call froze."""
    if gc.get_freeze_count():
        return False
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if 0 < young < YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    return True


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No garbage collection inside the block; at its end everything alive is frozen out of collection and
    collection is back as it was (see above: for a start-up whose objects all live as long as the process)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
