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

An engine may die during a push. Engines that carry an exit notice (`exited`: a future completed
when the engine's process is gone; `RemoteEngine` gets it from the fleet's supervised actor) are
watched by every wait of the group: a death wakes the push at once, whatever collective it is in.
The group is then dropped (rank 0 leaves it, so the survivors' collectives fail at once instead of
at gloo's deadline), formed again with the survivors and the whole push repeated to them; the
warning names the engine and the push. `paused` skips dead engines too. A restarted engine gets
the weights at the next push (slime.fleet.fleet: `awaiting_weights`).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
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
    all_reduce_done, first_line, model_tensors, new_gloo_group, new_store,
)

DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024  # slime's --update-weight-buffer-size default
DEATH_GRACE_S = 10.0  # a request that failed without an answer: time for the engine's exit notice to arrive

logger = logging.getLogger(__name__)


class WeightSyncError(RuntimeError):
    """A push or group operation failed; the message names the engine and what it said."""


class EngineAnswered(WeightSyncError):
    """The engine answered with an error status: it is alive (a refusal, not a death)."""


class EnginesDied(WeightSyncError):
    """Engines whose process exited during a group operation (`dead`); the group was dropped."""

    def __init__(self, message: str, dead: list[Any]):
        super().__init__(message)
        self.dead = dead


def exit_notice(engine: Any) -> cf.Future | None:
    """The engine's exit notice (a future done once its process is gone), or None when it has none."""
    notice = getattr(engine, "exited", None)
    return notice if isinstance(notice, cf.Future) else None


def _answered(exc: BaseException | None) -> bool:
    """Whether a failed call got the engine's own answer (an HTTP status): the engine is alive."""
    return isinstance(exc, (EngineAnswered, requests.HTTPError)) and not isinstance(exc, requests.ConnectionError)


def _failure(f: cf.Future) -> BaseException | None:
    return f.exception() if f.done() and not f.cancelled() else None


def dead_engines(engines: Sequence[Any], suspects: Sequence[Any] = (), grace: float = DEATH_GRACE_S) -> list[Any]:
    """The engines whose process is gone: those whose exit notice arrived, waiting up to `grace` for
    the first notice of `suspects` (engines whose call failed without an answer, or that a failed
    collective may have lost: a reset connection arrives a moment before the exit is reported)."""
    notices = [n for n in (exit_notice(e) for e in suspects) if n is not None]
    if notices:
        cf.wait(notices, timeout=grace, return_when=cf.FIRST_COMPLETED)
    return [e for e in engines if (n := exit_notice(e)) is not None and n.done()]


class HttpEngine:
    """slime's engine weight API over HTTP against one engine server (no Ray needed)."""

    exited: cf.Future | None = None  # a plain HTTP server gives no exit notice

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
            raise EngineAnswered(f"{self.url}{path}: HTTP {r.status_code}: {msg}")
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
            raise EngineAnswered(f"{self.url}/weights_checker: HTTP {r.status_code}: {answer.get('message')}")
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


def _settled(engines: Sequence[Any], futures: list[cf.Future], timeout: float, *, until_failure: bool) -> None:
    """Wait until every call is answered (or, `until_failure`, one fails), an engine's exit notice
    arrives, or `timeout` passes."""
    notices = [n for n in map(exit_notice, engines) if n is not None]
    deadline = time.monotonic() + timeout
    while True:
        pending = [f for f in futures if not f.done()]
        if not pending or (until_failure and any(map(_failure, futures))) or any(n.done() for n in notices):
            return
        left = deadline - time.monotonic()
        if left <= 0:
            return
        cf.wait(pending + notices, timeout=left, return_when=cf.FIRST_COMPLETED)


def _errors(engines: Sequence[Any], futures: list[cf.Future], timeout: float) -> list[str]:
    out = [f"{e!r}: {_failure(f)}" for e, f in zip(engines, futures) if _failure(f)]
    return out + [f"{e!r}: no answer within {timeout:g} s" for e, f in zip(engines, futures) if not f.done()]


def _gather(engines: Sequence[Any], futures: list[cf.Future], what: str, timeout: float) -> list[Any]:
    """Every engine's answer, or WeightSyncError listing every engine that failed (EnginesDied, with
    the dead engines, when one died: a death ends the wait at once)."""
    t0 = time.monotonic()
    _settled(engines, futures, timeout, until_failure=True)
    if all(f.done() and not _failure(f) for f in futures):
        return [f.result() for f in futures]
    suspects = [e for e, f in zip(engines, futures) if _failure(f) and not _answered(_failure(f))]
    dead = dead_engines(engines, suspects)
    if not dead:  # a refusal: the other engines' answers too (a death meanwhile still ends the wait)
        _settled(engines, futures, max(0.0, timeout - (time.monotonic() - t0)), until_failure=False)
        dead = dead_engines(engines)
    if dead:
        raise EnginesDied(f"{what}: {', '.join(map(repr, dead))} died", dead)
    errors = _errors(engines, futures, timeout)
    raise WeightSyncError(f"{what} failed on {len(errors)} of {len(engines)} engines: " + "; ".join(errors))


def on_all_engines(engines: Sequence[Any], method: str, timeout: float = 600.0, **kwargs) -> list[Any]:
    """Call `method(**kwargs)` on every engine concurrently; every answer, or one error naming each failure."""
    return _gather(engines, [_in_thread(getattr(e, method), **kwargs) for e in engines], method, timeout)


def on_live_engines(engines: Sequence[Any], method: str, timeout: float = 600.0, **kwargs) -> list[Any]:
    """`on_all_engines`, where an engine that died meanwhile is no error: the live engines' answers
    (a dead engine's slot holds None); a live engine's failure still raises."""
    futures = [_in_thread(getattr(e, method), **kwargs) for e in engines]
    cf.wait(futures, timeout=timeout)
    suspects = [e for e, f in zip(engines, futures) if _failure(f) and not _answered(_failure(f))]
    dead = {id(e) for e in dead_engines(engines, suspects)}
    live = [(e, f) for e, f in zip(engines, futures) if id(e) not in dead]
    if dead:
        logger.warning("%s: skipped %d dead engine(s): %s", method, len(dead),
                       ", ".join(repr(e) for e in engines if id(e) in dead))
    _gather([e for e, _ in live], [f for _, f in live], method, timeout)
    return [None if id(e) in dead else f.result() for e, f in zip(engines, futures)]


@contextlib.contextmanager
def paused(engines: Sequence[Any], timeout: float = 600.0) -> Iterator[None]:
    """pause_generation on every engine, then continue_generation on every engine whatever happens
    (an engine that died meanwhile is skipped: its replacement starts unpaused)."""
    on_live_engines(engines, "pause_generation", timeout)
    try:
        yield
    finally:
        on_live_engines(engines, "continue_generation", timeout)


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
    """`update_weights_from_tensor` bucket by bucket; each bucket is serialised once for all engines.
    An engine that dies meanwhile is skipped from then on; the live engines' last answers."""
    answers: list[dict] = []
    live = list(engines)
    for bucket in bucket_named_tensors(named_tensors, bucket_bytes):
        with serialize_named_tensors(bucket, transport=transport) as payload:
            said = on_live_engines(live, "update_weights_from_tensor", timeout,
                                   serialized_named_tensors=[payload.serialized], load_format=None,
                                   flush_cache=flush_cache, weight_version=weight_version)
        live, answers = [e for e, a in zip(live, said) if a is not None], [a for a in said if a is not None]
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

    An engine that dies (see the module doc: its exit notice) during `connect` or `push` is dropped:
    the group is formed again without it (named `<group_name>-<n>`) and the push repeated to the
    survivors; `died` lists the dropped engines with the push they died in.
    """

    def __init__(self, engines: Sequence[Any], *, group_name: str = "slime", master_address: str = "127.0.0.1",
                 master_port: int | None = None, backend: str = "gloo", timeout: float = 60.0,
                 transport: str = "auto", ring_slots: int = DEFAULT_SLOTS, ring_slot_bytes: int = DEFAULT_SLOT_BYTES):
        if backend != "gloo":
            raise WeightSyncError(f"the CPU trainer side supports backend 'gloo' only, got {backend!r}")
        if transport not in TRANSPORTS:
            raise WeightSyncError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        self.engines, self.group_name, self.backend, self.timeout = list(engines), group_name, backend, timeout
        self.base_name, self._formations = group_name, 0
        self.died: list[tuple[Any, str]] = []  # (engine, the operation it died in), in order
        self._waiters: set[threading.Event] = set()  # waits of rank 0 that an engine's death must wake
        self._wake_lock = threading.Lock()
        for notice in filter(None, map(exit_notice, self.engines)):
            notice.add_done_callback(self._wake_waiters)
        self.master_address, self.master_port = master_address, master_port
        self.requested_transport, self.ring_slots, self.ring_slot_bytes = transport, ring_slots, ring_slot_bytes
        self.transport: str | None = None  # RING or BROADCAST once connected
        self.transport_reason = ""
        self._pg = self._store = self._ring = None
        self._seq = 0  # ring chunks sent on this group (engines count them too)
        self._scratch: torch.Tensor | None = None  # reused flat send buffer (no page faults after the first push)
        # where the last push's time went (bench/bench_weight_sync.py prints it): rank 0's collectives vs the rest
        self.last_push_seconds: dict[str, float] = {}

    def _wake_waiters(self, _: Any = None) -> None:
        with self._wake_lock:
            for wake in self._waiters:
                wake.set()

    @property
    def connected(self) -> bool:
        return self._pg is not None

    def _key(self, key: str) -> str:
        return f"{self.group_name}/{key}"

    def connect(self) -> None:
        """Form the group; an engine that dies meanwhile is dropped and the group formed without it."""
        if self._pg is not None:
            raise WeightSyncError(f"group {self.group_name!r} is already connected")
        while True:
            try:
                return self._connect_once()
            except EnginesDied as exc:
                self._drop(exc.dead, f"forming weight-update group {self.group_name!r}")

    def _drop(self, dead: list[Any], during: str) -> None:
        """Leave the broken group, forget the dead engines, and name the next formation afresh (a
        survivor may still hold the old group until its collective fails)."""
        gone = {id(e) for e in dead}
        self.engines = [e for e in self.engines if id(e) not in gone]
        self._abandon()
        self.died += [(e, during) for e in dead]
        self._formations += 1
        self.group_name = f"{self.base_name}-{self._formations}"
        logger.warning("%s died during %s; %s", ", ".join(map(repr, dead)), during,
                       f"going on with the {len(self.engines)} surviving engine(s)" if self.engines
                       else "no engine is left")
        if not self.engines:
            raise WeightSyncError(f"every engine of the weight-update group died during {during}")

    def _connect_once(self) -> None:
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
        # Fail at the first engine that refuses or dies; the others (and rank 0) give up on their own at the deadline.
        deadline = self.timeout + 30
        _settled(self.engines, theirs, deadline, until_failure=True)
        if not all(f.done() and not _failure(f) for f in theirs):
            suspects = [e for e, f in zip(self.engines, theirs) if _failure(f) and not _answered(_failure(f))]
            dead = dead_engines(self.engines, suspects)
            if dead:
                gone = {id(e) for e in dead}
                on_all_engines_quietly([e for e in self.engines if id(e) not in gone], "destroy_weights_update_group",
                                       group_name=self.group_name)
                raise EnginesDied(f"init_weights_update_group {self.group_name!r}: "
                                  f"{', '.join(map(repr, dead))} died", dead)
            raise WeightSyncError(f"init_weights_update_group {self.group_name!r} failed: "
                                  + "; ".join(_errors(self.engines, theirs, deadline)))
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
        named = [(n, t.detach().cpu().contiguous()) for n, t in named_tensors]
        while True:
            try:
                return self._push_once(named, weight_version, bucket_bytes, load_format, flush_cache)
            except EnginesDied as exc:  # the survivors get the whole push again, in a group without the dead
                self._drop(exc.dead, f"the push of weight version {weight_version!r}")
                self.connect()

    def _push_once(self, named, weight_version, bucket_bytes, load_format, flush_cache) -> list[dict]:
        spent = {"collectives": 0.0, "copy": 0.0, "answers": 0.0, "total": 0.0, "buckets": 0}
        t_push = time.perf_counter()
        buckets = bucket_named_tensors(named, bucket_bytes)
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
            opts = torch.distributed.BroadcastOptions()
            opts.rootRank = 0
            sent = [self._flat(tensors)] if load_format == "flattened_bucket" else tensors
            error = self._await_works([self._pg.broadcast([t], opts) for t in sent], futures)
            if error is not None:
                self._lost_step(f"broadcast of bucket starting at {bucket[0][0]!r} on group {self.group_name!r}",
                                futures, error)
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
        except EnginesDied:
            raise
        except WeightSyncError:
            # an engine refused a bucket (400) after running every chunk's handshake: the group is still in step
            if self._pg is not None and not self._settle(in_flight):
                self.close()
            raise
        return answers

    def _wait_chunk(self, works: tuple[Any, Any], watch: list[cf.Future], first_name: str) -> None:
        """Wait until every engine copied a chunk, failing early when an engine's request fails meanwhile."""
        error = self._await_works([works[1]], watch, also=[works[0]])
        if error is not None:
            self._lost_step(f"shared-memory ring push on group {self.group_name!r} at the bucket starting at "
                            f"{first_name!r}", watch, error)

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
            f.add_done_callback(lambda f: wake.set() if _failure(f) and not _answered(_failure(f)) else None)
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
        suspects = [e for e, f in zip(self.engines, requests) if not _answered(_failure(f))] if requests \
            else self.engines  # rank 0 was draining its last chunks: any engine may be the one lost
        dead = dead_engines(self.engines, suspects)
        if dead:
            raise EnginesDied(f"{what}: {', '.join(map(repr, dead))} died ({error})", dead)
        said = [f"{e!r}: {_failure(f)}" for e, f in zip(self.engines, requests) if _failure(f)]
        self.close()  # connect again
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

    def close(self) -> None:
        """destroy_weights_update_group on every engine, then release rank 0's side (group and ring)."""
        if self._pg is None:
            return
        on_all_engines_quietly(self.engines, "destroy_weights_update_group", group_name=self.group_name)
        self._release()

    def _abandon(self) -> None:
        """Leave a group a member died in: rank 0's side first (the survivors' collectives with rank 0
        fail at once), then the survivors drop it (quietly: one may still be failing its collective)."""
        if self._pg is None:
            return
        self._release(abort=True)
        on_all_engines_quietly(self.engines, "destroy_weights_update_group", timeout=self.timeout,
                               group_name=self.group_name)

    def _release(self, abort: bool = False) -> None:
        """Rank 0's side of the group; `abort`: without waiting (gloo waits for a collective still
        pending, up to the group's deadline, so it is released on a thread of its own)."""
        pg, ring = self._pg, self._ring
        self._pg, self._store, self._scratch, self._ring = None, None, None, None

        def release() -> None:
            with contextlib.suppress(Exception):
                pg.abort() if abort else pg.shutdown()
            if ring is not None:
                ring.close()

        if abort:
            threading.Thread(target=release, daemon=True, name="weight-group-release").start()
        else:
            release()

    def __enter__(self) -> WeightUpdateGroup:
        self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def on_all_engines_quietly(engines: Sequence[Any], method: str, timeout: float = 30.0, **kwargs) -> None:
    """Best-effort cleanup call (an engine that is gone or never had the group is not an error here)."""
    with contextlib.suppress(WeightSyncError):
        on_all_engines(engines, method, timeout, **kwargs)
