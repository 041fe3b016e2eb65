"""How a push's bytes travel through a formed weight-update group, bucket by bucket: the
shared-memory ring (slime.weights.ring; rank 0 copies once, each engine once, gloo carries
only per-chunk handshakes) or a gloo broadcast of the tensors (slime's way across hosts).

`GroupTransport` is the push half of `slime.weights.group.WeightUpdateGroup`: it uses the
group's `engines`, `group_name`, `timeout`, `_pg`, `_ring`, `_seq`, `_scratch`, `_waiters` and
`_abandon`, and raises EnginesDied (the group re-forms) or WeightSyncError (the group, out of step, is
abandoned: connect again) when a step is lost.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from slime.weights.engine_calls import gather, in_thread
from slime.weights.engine_deaths import EnginesDied, WeightSyncError, answered, dead_engines, exit_notice, failure
from slime.weights.ring import bucket_digest, bucket_layout, chunks, header
from slime.weights.transfer import dtype_name
from slime.weights.receive import all_reduce_done, first_line


class GroupTransport:
    """Ring and broadcast pushes of a connected group (see the module doc for what it needs)."""

    def _flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        numel = sum(t.numel() for t in tensors)
        size = numel * tensors[0].element_size()
        if self._scratch is None or self._scratch.numel() < size:
            self._scratch = torch.empty(size, dtype=torch.uint8)
        flat = self._scratch[:size].view(tensors[0].dtype)
        torch.cat([t.reshape(-1) for t in tensors], out=flat)
        return flat

    def _send_metadata(
        self, bucket: list[tuple[str, torch.Tensor]], weight_version, load_format, flush_cache
    ) -> list[cf.Future]:
        return [
            in_thread(
                e.update_weights_from_distributed,
                names=[n for n, _ in bucket],
                dtypes=[dtype_name(t.dtype) for _, t in bucket],
                shapes=[list(t.shape) for _, t in bucket],
                group_name=self.group_name,
                flush_cache=flush_cache,
                weight_version=weight_version,
                load_format=load_format,
            )
            for e in self.engines
        ]

    def _answers(self, futures: list[cf.Future], bucket: list[tuple[str, torch.Tensor]]) -> list[dict]:
        return gather(
            self.engines,
            futures,
            f"update_weights_from_distributed (bucket starting at {bucket[0][0]!r})",
            self.timeout + 60,
        )

    def _push_broadcast(self, buckets, weight_version, load_format, flush_cache, spent) -> list[dict]:
        answers: list[dict] = []
        for bucket in buckets:
            tensors = [t for _, t in bucket]
            futures = self._send_metadata(bucket, weight_version, load_format, flush_cache)
            t0 = time.perf_counter()
            opts = torch.distributed.BroadcastOptions()
            opts.rootRank = 0
            sent = [self._flat(tensors)] if load_format == "flattened_bucket" else tensors
            error = self._await_works([self._pg.broadcast([t], opts) for t in sent], futures)
            if error is not None:
                self._lost_step(
                    f"broadcast of bucket starting at {bucket[0][0]!r} on group {self.group_name!r}", futures, error
                )
            t1 = time.perf_counter()
            answers = self._answers(futures, bucket)
            spent["collectives"] += t1 - t0
            spent["answers"] += time.perf_counter() - t1
            spent["buckets"] += 1
        return answers

    def _push_ring(self, buckets, weight_version, load_format, flush_cache, spent) -> list[dict]:
        """Chunks through the ring: rank 0 writes chunk k+1 into the next slot while the engines copy chunk k;
        a slot is reused once every engine said it is done with it. A bucket's request is sent only after
        the previous bucket's answers (an engine must never see two requests of one push at once)."""
        ring, nslots = self._ring, len(self._ring.slots)
        opts = torch.distributed.BroadcastOptions()
        opts.rootRank = 0
        in_flight: dict[int, tuple[Any, Any]] = {}  # chunk seq -> (header work, done work)
        answers: list[dict] = []
        prev: tuple[list[cf.Future], list] | None = None  # the previous bucket: its requests, its tensors

        def request(bucket: list[tuple[str, torch.Tensor]]) -> list[cf.Future]:
            """Send a bucket's request once the previous bucket is answered."""
            nonlocal answers
            if prev is not None:
                answers = self._answers(*prev)
            return self._send_metadata(bucket, weight_version, load_format, flush_cache)

        try:
            for bucket in buckets:
                names, tensors = [n for n, _ in bucket], [t for _, t in bucket]
                dtypes, shapes = [t.dtype for t in tensors], [list(t.shape) for t in tensors]
                offsets, sizes, total = bucket_layout(dtypes, shapes)
                digest = bucket_digest(names, dtypes, shapes)
                futures: list[cf.Future] | None = None
                for start, length in chunks(total, ring.slot_bytes):
                    seq = self._seq
                    slot = seq % nslots
                    if seq - nslots in in_flight:  # the slot's previous chunk must be copied by every engine
                        t0 = time.perf_counter()
                        self._wait_chunk(in_flight.pop(seq - nslots), futures or (prev[0] if prev else []), names[0])
                        spent["collectives"] += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    ring.write(slot, tensors, offsets, sizes, start, length)
                    spent["copy"] += time.perf_counter() - t0
                    if futures is None:  # the first chunk is in its slot: the engines may start
                        futures = request(bucket)
                    in_flight[seq] = (
                        self._pg.broadcast([header(seq, slot, start, length, digest)], opts),
                        all_reduce_done(self._pg),
                    )
                    self._seq += 1
                if futures is None:  # a bucket of empty tensors: no bytes, only the request
                    futures = request(bucket)
                prev = (futures, bucket)
                spent["buckets"] += 1
            t0 = time.perf_counter()
            if prev is not None:
                answers = self._answers(*prev)
            for seq in sorted(in_flight):
                self._wait_chunk(in_flight.pop(seq), [], "the last bucket")
            spent["answers"] += time.perf_counter() - t0
        except EnginesDied:
            raise
        except WeightSyncError:
            # an engine refused a bucket (400) after running every chunk's handshake: the group is still in step
            if self._pg is not None and not self._settle(in_flight):
                self._abandon()  # collectives still pending: freed off this thread (see WeightUpdateGroup._release)
            raise
        return answers

    def _wait_chunk(self, works: tuple[Any, Any], watch: list[cf.Future], first_name: str) -> None:
        """Wait until every engine copied a chunk, failing early when an engine's request fails meanwhile."""
        error = self._await_works([works[1]], watch, also=[works[0]])
        if error is not None:
            self._lost_step(
                f"shared-memory ring push on group {self.group_name!r} at the bucket starting at {first_name!r}",
                watch,
                error,
            )

    def _await_works(self, works: list[Any], requests: list[cf.Future], also: Sequence[Any] = ()) -> str | None:
        """Wait for rank 0's collectives `works` (then `also`), waking early when an engine's request
        fails without an answer or an engine dies; None when they all completed, else why not."""
        wake = threading.Event()
        left = [len(works)]
        lock = threading.Lock()

        def one_done(_: Any) -> None:
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    wake.set()

        for w in works:
            w.get_future().add_done_callback(one_done)
        for f in requests:  # an engine's refusal (an answer) is no reason: it still runs the collectives
            f.add_done_callback(lambda f: wake.set() if failure(f) and not answered(failure(f)) else None)
        with self._wake_lock:
            self._waiters.add(wake)
        try:
            if any(n.done() for n in filter(None, map(exit_notice, self.engines))):
                wake.set()
            if not wake.wait(self.timeout + 30):
                return f"no progress within {self.timeout + 30:g} s"
        finally:
            with self._wake_lock:
                self._waiters.discard(wake)
        with lock:
            if left[0]:
                return "an engine failed or died"
        try:
            for w in [*works, *also]:
                w.wait()
        except Exception as exc:  # noqa: BLE001 - e.g. an engine process died
            return first_line(exc)
        return None

    def _lost_step(self, what: str, requests: list[cf.Future], error: str) -> None:
        """The group lost step with the engines: raise EnginesDied naming the dead ones (the caller forms
        the group again without them), else close the group and raise what the engines said."""
        suspects = (
            [e for e, f in zip(self.engines, requests) if not answered(failure(f))] if requests else self.engines
        )  # rank 0 was draining its last chunks: any engine may be the one lost
        dead = dead_engines(self.engines, suspects)
        if dead:
            raise EnginesDied(f"{what}: {', '.join(map(repr, dead))} died ({error})", dead, zip(self.engines, requests))
        said = [f"{e!r}: {failure(f)}" for e, f in zip(self.engines, requests) if failure(f)]
        self._abandon()  # out of step, collectives may be pending: freed off this thread; connect again
        raise WeightSyncError(f"{what} failed: {error}" + (f"; engines said: {'; '.join(said)}" if said else ""))

    def _settle(self, in_flight: dict[int, tuple[Any, Any]], grace: float = 10.0) -> bool:
        """After an engine's error: whether every chunk sent still completes (the engines kept step)."""
        deadline = time.monotonic() + grace
        for hdr, done in in_flight.values():
            ok = threading.Event()
            done.get_future().add_done_callback(lambda _: ok.set())
            if not ok.wait(max(0.0, deadline - time.monotonic())):
                return False
            with contextlib.suppress(Exception):
                hdr.wait()
        in_flight.clear()
        return True
