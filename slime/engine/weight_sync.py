"""Trainer side of weight sync: push a model's named tensors to every engine, by shared memory /
value (`push_tensors`) or by a `torch.distributed` broadcast in buckets (`WeightUpdateGroup`).

An *engine* here is anything with slime's engine methods (`update_weights_from_tensor`,
`init_weights_update_group`, `update_weights_from_distributed`, `destroy_weights_update_group`,
`pause_generation`, `continue_generation`, `check_weights`), called with keyword arguments and
returning the engine's JSON answer or raising: `HttpEngine(url)` from a plain process (tests,
benchmarks), `slime.fleet.engine_actor.RemoteEngine(actor)` for Ray engine actors.

Every engine is called concurrently (one thread each) while rank 0 broadcasts, as slime's Megatron
trainer does; every wait is bounded (`timeout`), and a failure names the engine and the tensor.

Transport of the distributed path (`WeightUpdateGroup(transport=...)`): "auto" (default) offers the
engines a shared-memory ring (slime.engine.weight_ring) at connect and uses it when every engine is on
this host and mapped it: the bytes are copied once by rank 0 and once by each engine, and the gloo
group carries only tiny per-chunk handshakes. Otherwise, or with "broadcast", the tensors themselves
are broadcast over gloo (what slime does across hosts). Both keep slime's request bodies; "auto" adds
one optional field to init_weights_update_group.
A push in several buckets should run inside `paused(engines)` (pause → push → continue, slime's
order), so no request decodes on a half-pushed model.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import requests
import torch

from slime.engine.weight_ring import (
    BROADCAST, DECISION_KEY, DEFAULT_SLOT_BYTES, DEFAULT_SLOTS, OFFER_KEY, RING, TRANSPORTS, RingWriter,
    bucket_digest, bucket_layout, chunks, header,
)
from slime.engine.weight_transfer import (
    bucket_named_tensors, dtype_name, named_checksums, serialize_named_tensors,
)
from slime.engine.weight_updates import (
    all_reduce_done, broadcast, first_line, model_tensors, new_gloo_group, new_store,
)

DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024  # slime's --update-weight-buffer-size default


class WeightSyncError(RuntimeError):
    """A push or group operation failed; the message names the engine and what it said."""


class HttpEngine:
    """slime's engine weight API over HTTP against one engine server (no Ray needed)."""

    def __init__(self, url: str, timeout: float = 600.0):
        self.url, self.timeout = url.rstrip("/"), timeout

    def __repr__(self) -> str:
        return f"HttpEngine({self.url})"

    def _post(self, path: str, body: dict, timeout: float | None = None) -> dict:
        r = requests.post(f"{self.url}{path}", json=body, timeout=timeout or self.timeout)
        try:
            answer = r.json()
        except ValueError:
            answer = {"message": r.text}
        if r.status_code >= 400:
            msg = answer.get("message") or (answer.get("error") or {}).get("message") or r.text
            raise WeightSyncError(f"{self.url}{path}: HTTP {r.status_code}: {msg}")
        return answer

    def update_weights_from_tensor(self, serialized_named_tensors, load_format=None, flush_cache=False,
                                   weight_version=None) -> dict:
        return self._post("/update_weights_from_tensor", {
            "serialized_named_tensors": serialized_named_tensors, "load_format": load_format,
            "flush_cache": flush_cache, "weight_version": weight_version})

    def init_weights_update_group(self, master_address, master_port, rank_offset, world_size, group_name,
                                  backend, timeout: float | None = None, weight_transport: str | None = None) -> dict:
        body = {"master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
                "world_size": world_size, "group_name": group_name, "backend": backend}
        if timeout is not None:
            body["timeout"] = timeout
        if weight_transport is not None:
            body["weight_transport"] = weight_transport
        return self._post("/init_weights_update_group", body, timeout=(timeout or self.timeout) + 30)

    def update_weights_from_distributed(self, names, dtypes, shapes, group_name, flush_cache=False,
                                        weight_version=None, load_format=None) -> dict:
        return self._post("/update_weights_from_distributed", {
            "names": names, "dtypes": [dtype_name(d) if isinstance(d, torch.dtype) else d for d in dtypes],
            "shapes": [list(s) for s in shapes], "group_name": group_name, "flush_cache": flush_cache,
            "weight_version": weight_version, "load_format": load_format})

    def destroy_weights_update_group(self, group_name) -> dict:
        return self._post("/destroy_weights_update_group", {"group_name": group_name})

    def pause_generation(self, mode: str | None = None) -> dict:
        return self._post("/pause_generation", {} if mode is None else {"mode": mode})

    def continue_generation(self) -> dict:
        return self._post("/continue_generation", {})

    def check_weights(self, action: str, checksums: dict[str, str] | None = None) -> dict:
        """The checker's answer; a compare that finds differences is an answer too (`equal` false)."""
        body: dict[str, Any] = {"action": action}
        if checksums is not None:
            body["checksums"] = checksums
        r = requests.post(f"{self.url}/weights_checker", json=body, timeout=self.timeout)
        answer = r.json()
        if r.status_code >= 400 and "equal" not in answer:
            raise WeightSyncError(f"{self.url}/weights_checker: HTTP {r.status_code}: {answer.get('message')}")
        return answer

    def get_weight_version(self) -> str:
        r = requests.get(f"{self.url}/get_weight_version", timeout=self.timeout)
        r.raise_for_status()
        return r.json()["weight_version"]


def _in_thread(fn, *args, **kwargs) -> cf.Future:
    """Run fn in a daemon thread (a stuck call never blocks interpreter exit; every call has its own deadline)."""
    fut: cf.Future = cf.Future()

    def run():
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter
            fut.set_exception(exc)

    threading.Thread(target=run, daemon=True, name=f"weight-sync-{getattr(fn, '__name__', 'call')}").start()
    return fut


def _gather(engines: Sequence[Any], futures: list[cf.Future], what: str, timeout: float) -> list[Any]:
    """Every engine's answer, or WeightSyncError listing every engine that failed."""
    done, pending = cf.wait(futures, timeout=timeout)
    errors = [f"{e!r}: no answer within {timeout:g} s" for e, f in zip(engines, futures) if f in pending]
    errors += [f"{e!r}: {f.exception()}" for e, f in zip(engines, futures) if f in done and f.exception()]
    if errors:
        raise WeightSyncError(f"{what} failed on {len(errors)} of {len(engines)} engines: " + "; ".join(errors))
    return [f.result() for f in futures]


def on_all_engines(engines: Sequence[Any], method: str, timeout: float = 600.0, **kwargs) -> list[Any]:
    """Call `method(**kwargs)` on every engine concurrently; every answer, or one error naming each failure."""
    return _gather(engines, [_in_thread(getattr(e, method), **kwargs) for e in engines], method, timeout)


@contextlib.contextmanager
def paused(engines: Sequence[Any], timeout: float = 600.0) -> Iterator[None]:
    """pause_generation on every engine, then continue_generation on every engine whatever happens."""
    on_all_engines(engines, "pause_generation", timeout)
    try:
        yield
    finally:
        on_all_engines(engines, "continue_generation", timeout)


def trainer_named_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """What a push sends: parameters and persistent buffers, each tied tensor once (under its first name)."""
    seen: set[int] = set()
    out = []
    for name, t in model_tensors(model).items():
        if id(t) not in seen:
            seen.add(id(t))
            out.append((name, t.detach()))
    return out


def model_checksums(model: torch.nn.Module) -> dict[str, str]:
    """`check_weights("compare", checksums=...)` argument for the trainer's current weights."""
    return named_checksums(trainer_named_tensors(model))


def push_tensors(engines: Sequence[Any], named_tensors: Iterable[tuple[str, torch.Tensor]], *,
                 weight_version: str | None, bucket_bytes: int = DEFAULT_BUCKET_BYTES, transport: str = "shm",
                 flush_cache: bool = False, timeout: float = 600.0) -> list[dict]:
    """`update_weights_from_tensor` bucket by bucket; each bucket is serialised once for all engines."""
    answers: list[dict] = []
    for bucket in bucket_named_tensors(named_tensors, bucket_bytes):
        with serialize_named_tensors(bucket, transport=transport) as payload:
            answers = on_all_engines(engines, "update_weights_from_tensor", timeout,
                                     serialized_named_tensors=[payload.serialized], load_format=None,
                                     flush_cache=flush_cache, weight_version=weight_version)
    return answers


class WeightUpdateGroup:
    """Trainer rank 0 of a gloo group with every engine (engine i is rank i + 1); pushes in buckets.

        group = WeightUpdateGroup(engines, group_name="slime")
        group.connect()
        with paused(engines):
            group.push(model.named_parameters(), weight_version="3")
        group.close()

    `timeout` bounds the rendezvous and every collective: an engine that never joins makes
    `connect()` raise within it, and nothing keeps waiting after it. `transport` "auto" uses the
    shared-memory ring when every engine can map it (`self.transport` says what was chosen, and
    `transport_reason` why not), "broadcast" never offers it. A push that loses step with the
    engines closes the group (`connected` turns False): connect again.
    """

    def __init__(self, engines: Sequence[Any], *, group_name: str = "slime", master_address: str = "127.0.0.1",
                 master_port: int | None = None, backend: str = "gloo", timeout: float = 60.0,
                 transport: str = "auto", ring_slots: int = DEFAULT_SLOTS, ring_slot_bytes: int = DEFAULT_SLOT_BYTES):
        if backend != "gloo":
            raise WeightSyncError(f"the CPU trainer side supports backend 'gloo' only, got {backend!r}")
        if transport not in TRANSPORTS:
            raise WeightSyncError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        self.engines, self.group_name, self.backend, self.timeout = list(engines), group_name, backend, timeout
        self.master_address, self.master_port = master_address, master_port
        self.requested_transport, self.ring_slots, self.ring_slot_bytes = transport, ring_slots, ring_slot_bytes
        self.transport: str | None = None  # RING or BROADCAST once connected
        self.transport_reason = ""
        self._pg = self._store = self._ring = None
        self._seq = 0  # ring chunks sent on this group (engines count them too)
        self._scratch: torch.Tensor | None = None  # reused flat send buffer (no page faults after the first push)
        # where the last push's time went (bench/bench_weight_sync.py prints it): rank 0's collectives vs the rest
        self.last_push_seconds: dict[str, float] = {}

    @property
    def connected(self) -> bool:
        return self._pg is not None

    def _key(self, key: str) -> str:
        return f"{self.group_name}/{key}"

    def connect(self) -> None:
        if self._pg is not None:
            raise WeightSyncError(f"group {self.group_name!r} is already connected")
        from slime.utils.misc import find_free_port

        port = self.master_port or find_free_port(self.master_address)
        world = len(self.engines) + 1
        try:
            store = new_store(self.master_address, port, world, self.timeout, is_master=True)
        except Exception as exc:  # noqa: BLE001
            raise WeightSyncError(f"trainer rank 0 could not serve group {self.group_name!r} on "
                                  f"{self.master_address}:{port}: {first_line(exc)}") from None
        ring, self.transport_reason = None, "broadcast requested" if self.requested_transport == BROADCAST else ""
        if self.requested_transport == "auto":
            try:
                ring = RingWriter.create(self.ring_slots, self.ring_slot_bytes)
                store.set(self._key(OFFER_KEY), ring.offer())
            except OSError as exc:  # e.g. no room in /dev/shm: the broadcast still works
                self.transport_reason = f"could not create the shared-memory ring: {exc}"
                if ring is not None:
                    ring.close()
                ring = None
        try:
            answers = self._rendezvous(store, port, world, "auto" if ring is not None else None)
            said = [a.get("weight_transport") if isinstance(a, dict) else None for a in answers]
            use_ring = ring is not None and all(x == RING for x in said)
            store.set(self._key(DECISION_KEY), RING if use_ring else BROADCAST)
        except BaseException:
            if ring is not None:
                ring.close()
            raise
        if ring is not None:
            ring.unlink()  # every engine has answered: mapped (or given up); nothing stays on disk
            if not use_ring:
                ring.close()
                self.transport_reason = "; ".join(
                    f"{e!r}: {a.get('weight_transport_reason') or 'engine does not offer the ring'}"
                    for e, a, x in zip(self.engines, answers, said) if x != RING)
        self._ring, self._seq = (ring if use_ring else None), 0
        self.transport = RING if use_ring else BROADCAST

    def _rendezvous(self, store, port: int, world: int, weight_transport: str | None) -> list[Any]:
        """Form the group (rank 0 here, every engine concurrently); every engine's init answer."""
        mine = _in_thread(new_gloo_group, self.master_address, port, 0, world, self.group_name, self.timeout,
                          is_master=True, store=store)
        extra = {} if weight_transport is None else {"weight_transport": weight_transport}
        theirs = [_in_thread(e.init_weights_update_group, master_address=self.master_address, master_port=port,
                             rank_offset=i + 1, world_size=world, group_name=self.group_name, backend=self.backend,
                             timeout=self.timeout, **extra)
                  for i, e in enumerate(self.engines)]
        # Fail at the first engine that refuses; the others (and rank 0) give up on their own at the deadline.
        deadline = self.timeout + 30
        done, pending = cf.wait(theirs, timeout=deadline, return_when=cf.FIRST_EXCEPTION)
        errors = [f"{e!r}: {f.exception()}" for e, f in zip(self.engines, theirs) if f in done and f.exception()]
        if errors or pending:
            errors += [f"{e!r}: no answer within {deadline:g} s" for e, f in zip(self.engines, theirs) if f in pending]
            raise WeightSyncError(f"init_weights_update_group {self.group_name!r} failed: " + "; ".join(errors))
        try:
            self._pg, self._store = mine.result(timeout=deadline)
        except Exception as exc:  # noqa: BLE001
            on_all_engines_quietly(self.engines, "destroy_weights_update_group", group_name=self.group_name)
            raise WeightSyncError(f"trainer rank 0 could not form group {self.group_name!r} on "
                                  f"{self.master_address}:{port}: {first_line(exc)}") from None
        return [f.result() for f in theirs]

    def _flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        numel = sum(t.numel() for t in tensors)
        size = numel * tensors[0].element_size()
        if self._scratch is None or self._scratch.numel() < size:
            self._scratch = torch.empty(size, dtype=torch.uint8)
        flat = self._scratch[:size].view(tensors[0].dtype)
        torch.cat([t.reshape(-1) for t in tensors], out=flat)
        return flat

    def _send_metadata(self, bucket: list[tuple[str, torch.Tensor]], weight_version, load_format,
                       flush_cache) -> list[cf.Future]:
        return [_in_thread(e.update_weights_from_distributed, names=[n for n, _ in bucket],
                           dtypes=[dtype_name(t.dtype) for _, t in bucket], shapes=[list(t.shape) for _, t in bucket],
                           group_name=self.group_name, flush_cache=flush_cache, weight_version=weight_version,
                           load_format=load_format) for e in self.engines]

    def _answers(self, futures: list[cf.Future], bucket: list[tuple[str, torch.Tensor]]) -> list[dict]:
        return _gather(self.engines, futures, f"update_weights_from_distributed (bucket starting at "
                                              f"{bucket[0][0]!r})", self.timeout + 60)

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, weight_version: str | None,
             bucket_bytes: int = DEFAULT_BUCKET_BYTES, load_format: str | None = None,
             flush_cache: bool = False) -> list[dict]:
        """Push every tensor, one bucket at a time: each engine is told the bucket's names, dtypes and
        shapes (concurrently), the bytes follow (ring or broadcast), then every engine's answer is awaited.

        Broadcast, `load_format` None (SGLang's default): one broadcast per tensor, received by the embedded
        engine straight into its parameters (no copy on either side). "flattened_bucket": one broadcast of
        the bucket concatenated (fewer collectives, one copy on each side). Through the ring both layouts
        travel the same way (one copy by rank 0, one per engine)."""
        if self._pg is None:
            raise WeightSyncError(f"group {self.group_name!r} is not connected; call connect() first")
        spent = {"collectives": 0.0, "copy": 0.0, "answers": 0.0, "total": 0.0, "buckets": 0}
        t_push = time.perf_counter()
        buckets = bucket_named_tensors(((n, t.detach().cpu().contiguous()) for n, t in named_tensors), bucket_bytes)
        if self._ring is not None:
            answers = self._push_ring(buckets, weight_version, load_format, flush_cache, spent)
        else:
            answers = self._push_broadcast(buckets, weight_version, load_format, flush_cache, spent)
        spent["total"] = time.perf_counter() - t_push
        self.last_push_seconds = spent
        return answers

    def _push_broadcast(self, buckets, weight_version, load_format, flush_cache, spent) -> list[dict]:
        answers: list[dict] = []
        for bucket in buckets:
            tensors = [t for _, t in bucket]
            futures = self._send_metadata(bucket, weight_version, load_format, flush_cache)
            t0 = time.perf_counter()
            try:
                if load_format == "flattened_bucket":
                    broadcast(self._pg, self._flat(tensors))
                else:
                    broadcast(self._pg, *tensors)
            except Exception as exc:  # noqa: BLE001 - report what the engines said, they know why
                said = [f"{e!r}: {f.exception()}" for e, f in zip(self.engines, futures) if f.done() and f.exception()]
                self.close()  # the group lost step: connect again
                raise WeightSyncError(f"broadcast of bucket starting at {bucket[0][0]!r} on group {self.group_name!r} "
                                      f"failed: {first_line(exc)}"
                                      + (f"; engines said: {'; '.join(said)}" if said else "")) from None
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
                    in_flight[seq] = (self._pg.broadcast([header(seq, slot, start, length, digest)], opts),
                                      all_reduce_done(self._pg))
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
        except WeightSyncError:
            # an engine refused a bucket (400) after running every chunk's handshake: the group is still in step
            if self._pg is not None and not self._settle(in_flight):
                self.close()
            raise
        return answers

    def _wait_chunk(self, works: tuple[Any, Any], watch: list[cf.Future], first_name: str) -> None:
        """Wait until every engine copied a chunk, failing early when an engine's request fails meanwhile."""
        wake = threading.Event()
        fut = works[1].get_future()
        fut.add_done_callback(lambda _: wake.set())
        for f in watch:
            f.add_done_callback(lambda f: wake.set() if f.exception() else None)
        wake.wait(self.timeout + 30)
        if not fut.done():  # an engine gave up, or nothing within the deadline: the group lost step
            said = [f"{e!r}: {f.exception()}" for e, f in zip(self.engines, watch) if f.done() and f.exception()]
            self.close()
            raise WeightSyncError(f"shared-memory ring push on group {self.group_name!r} failed at the bucket "
                                  f"starting at {first_name!r}: "
                                  + ("; ".join(said) if said else f"no engine finished a chunk within "
                                                                  f"{self.timeout + 30:g} s"))
        try:
            works[0].wait()
            works[1].wait()
        except Exception as exc:  # noqa: BLE001 - e.g. an engine process died
            self.close()
            raise WeightSyncError(f"shared-memory ring push on group {self.group_name!r} failed at the bucket "
                                  f"starting at {first_name!r}: {first_line(exc)}") from None

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

    def close(self) -> None:
        """destroy_weights_update_group on every engine, then release rank 0's side (group and ring)."""
        if self._pg is None:
            return
        on_all_engines_quietly(self.engines, "destroy_weights_update_group", group_name=self.group_name)
        pg, self._pg, self._store, self._scratch = self._pg, None, None, None
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        try:
            pg.shutdown()
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> WeightUpdateGroup:
        self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def on_all_engines_quietly(engines: Sequence[Any], method: str, timeout: float = 30.0, **kwargs) -> None:
    """Best-effort cleanup call (an engine that is gone or never had the group is not an error here)."""
    with contextlib.suppress(WeightSyncError):
        on_all_engines(engines, method, timeout, **kwargs)
