"""`WeightUpdateGroup`: trainer rank 0 of a gloo group with every engine, and what happens when a
member dies: the group is dropped, formed again with the survivors and the push repeated to them.

How the bytes travel once the group is formed (shared-memory ring or broadcast) is
slime.weights.group_transport; engine calls and death detection are slime.weights.engine_calls
and slime.weights.engine_deaths.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from slime.weights.engine_calls import call_errors, in_thread, on_all_engines_quietly, settled
from slime.weights.engine_deaths import (
    EnginesDied,
    WeightSyncError,
    call_outcome,
    dead_engines,
    exit_notice,
    exit_reason,
    failure,
    suspects,
)
from slime.weights.group_transport import GroupTransport
from slime.weights.ring import (
    BROADCAST,
    DECISION_KEY,
    DEFAULT_SLOT_BYTES,
    DEFAULT_SLOTS,
    OFFER_KEY,
    RING,
    TRANSPORTS,
    RingWriter,
)
from slime.weights.transfer import bucket_named_tensors
from slime.weights.receive import first_line, new_gloo_group, new_store

DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024  # slime's --update-weight-buffer-size default

logger = logging.getLogger(__name__)


class WeightUpdateGroup(GroupTransport):
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
    survivors; `died` lists the dropped engines with the push they died in, and `losses` records each
    loss: how each death was known (`exit`: its exit notice; a Ray actor lost with its node names the
    node; `cause`: what ended rank 0's wait, the notice or the group's deadline) and how each survivor's call
    in the dropped group ended (`survivors`: released by the destroy, or answered; never left to the
    group's deadline, see SupervisedEngineActor's "control" group).
    """

    def __init__(
        self,
        engines: Sequence[Any],
        *,
        group_name: str = "slime",
        master_address: str = "127.0.0.1",
        master_port: int | None = None,
        backend: str = "gloo",
        timeout: float = 60.0,
        transport: str = "auto",
        ring_slots: int = DEFAULT_SLOTS,
        ring_slot_bytes: int = DEFAULT_SLOT_BYTES,
    ):
        if backend != "gloo":
            raise WeightSyncError(f"the CPU trainer side supports backend 'gloo' only, got {backend!r}")
        if transport not in TRANSPORTS:
            raise WeightSyncError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        self.engines, self.group_name, self.backend, self.timeout = list(engines), group_name, backend, timeout
        self.base_name, self._formations = group_name, 0
        self.died: list[tuple[Any, str]] = []  # (engine, the operation it died in), in order
        self.losses: list[dict[str, Any]] = []  # one record per dropped group (see the class doc)
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
                self._drop(exc, f"forming weight-update group {self.group_name!r}")

    def _drop(self, lost: EnginesDied, during: str) -> None:
        """Leave the broken group, forget the dead engines, and name the next formation afresh (a
        survivor may still hold the old group until its collective fails). In a formed group the
        survivors' calls end once the destroy reaches them: awaited (bounded) before the next formation,
        which they could not join before; how they ended is recorded in `losses`. (A rendezvous the
        dead never joined is not awaited: its survivors' joins end at their own deadline.)"""
        dead = lost.dead
        gone = {id(e) for e in dead}
        self.engines = [e for e in self.engines if id(e) not in gone]
        formed = self._pg is not None
        self._abandon()
        theirs = [(e, f) for e, f in lost.calls if id(e) not in gone]
        if formed:
            cf.wait([f for _, f in theirs], timeout=self.timeout + 30)
        exits = {repr(e): exit_reason(e) for e in dead}
        self.losses.append(
            {
                "engines": [repr(e) for e in dead],
                "during": during,
                "exit": exits,
                "cause": str(lost),
                "survivors": {repr(e): call_outcome(f) for e, f in theirs},
            }
        )
        self.died += [(e, during) for e in dead]
        self._formations += 1
        self.group_name = f"{self.base_name}-{self._formations}"
        logger.warning(
            "%s died during %s (%s); %s",
            ", ".join(map(repr, dead)),
            during,
            "; ".join(f"{k}: {v}" for k, v in exits.items() if v) or "no exit notice",
            f"going on with the {len(self.engines)} surviving engine(s)" if self.engines else "no engine is left",
        )
        if not self.engines:
            raise WeightSyncError(f"every engine of the weight-update group died during {during}")

    def _connect_once(self) -> None:
        world = len(self.engines) + 1
        try:  # port 0: the store binds one the OS picks (a port found free first could be taken before it binds)
            store = new_store(self.master_address, self.master_port or 0, world, self.timeout, is_master=True)
        except Exception as exc:  # noqa: BLE001
            raise WeightSyncError(
                f"trainer rank 0 could not serve group {self.group_name!r} on "
                f"{self.master_address}:{self.master_port or '(a free port)'}: {first_line(exc)}"
            ) from None
        port = store.port
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
                    for e, a, x in zip(self.engines, answers, said)
                    if x != RING
                )
        self._ring, self._seq = (ring if use_ring else None), 0
        self.transport = RING if use_ring else BROADCAST

    def _rendezvous(self, store, port: int, world: int, weight_transport: str | None) -> list[Any]:
        """Form the group (rank 0 here, every engine concurrently); every engine's init answer."""
        mine = in_thread(
            new_gloo_group,
            self.master_address,
            port,
            0,
            world,
            self.group_name,
            self.timeout,
            is_master=True,
            store=store,
        )
        extra = {} if weight_transport is None else {"weight_transport": weight_transport}
        theirs = [
            in_thread(
                e.init_weights_update_group,
                master_address=self.master_address,
                master_port=port,
                rank_offset=i + 1,
                world_size=world,
                group_name=self.group_name,
                backend=self.backend,
                timeout=self.timeout,
                **extra,
            )
            for i, e in enumerate(self.engines)
        ]
        # Fail at the first engine that refuses or dies; the others (and rank 0) give up on their own at the deadline.
        deadline = self.timeout + 30
        settled(self.engines, theirs, deadline, until_failure=True)
        if not all(f.done() and not failure(f) for f in theirs):
            # a refusal may be a survivor's first news of a peer lost while joining: the engines still
            # joining are suspects too (their exit notices are awaited up to the grace, only on this path)
            pending = [e for e, f in zip(self.engines, theirs) if not f.done()]
            dead = dead_engines(self.engines, suspects(self.engines, theirs) + pending)
            if dead:
                gone = {id(e) for e in dead}
                on_all_engines_quietly(
                    [e for e in self.engines if id(e) not in gone],
                    "destroy_weights_update_group",
                    group_name=self.group_name,
                )
                raise EnginesDied(
                    f"init_weights_update_group {self.group_name!r}: {', '.join(map(repr, dead))} died",
                    dead,
                    zip(self.engines, theirs),
                )
            raise WeightSyncError(
                f"init_weights_update_group {self.group_name!r} failed: "
                + "; ".join(call_errors(self.engines, theirs, deadline))
            )
        try:
            self._pg, self._store = mine.result(timeout=deadline)
        except Exception as exc:  # noqa: BLE001
            on_all_engines_quietly(self.engines, "destroy_weights_update_group", group_name=self.group_name)
            raise WeightSyncError(
                f"trainer rank 0 could not form group {self.group_name!r} on "
                f"{self.master_address}:{port}: {first_line(exc)}"
            ) from None
        return [f.result() for f in theirs]

    def push(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        *,
        weight_version: str | None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        load_format: str | None = None,
        flush_cache: bool = False,
    ) -> list[dict]:
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
                self._drop(exc, f"the push of weight version {weight_version!r}")
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
        on_all_engines_quietly(
            self.engines, "destroy_weights_update_group", timeout=self.timeout, group_name=self.group_name
        )

    def _release(self, abort: bool = False) -> None:
        """Rank 0's side of the group; `abort`: without waiting. Gloo's group joins its worker threads
        when it is freed, and a thread still in a collective with a dead member returns only at the
        group's deadline: so an aborted group is freed on a thread of its own, which holds its only
        reference (freed here, it would block the push until that deadline)."""
        held = [self._pg, self._ring]
        self._pg, self._store, self._scratch, self._ring = None, None, None, None
        if abort:
            threading.Thread(target=_free_group, args=(held, True), daemon=True, name="weight-group-release").start()
        else:
            _free_group(held, False)

    def __enter__(self) -> WeightUpdateGroup:
        self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _free_group(held: list, abort: bool) -> None:
    """Abort (or shut down) rank 0's gloo group and close its ring; `held` ([group, ring]) is emptied,
    so the group is freed in this thread."""
    pg, ring = held.pop(0), held.pop(0)
    with contextlib.suppress(Exception):
        pg.abort() if abort else pg.shutdown()
    if ring is not None:
        ring.close()
    del pg
