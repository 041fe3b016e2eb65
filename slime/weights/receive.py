"""Engine side of in-memory weight sync: the model's tensor table, validation of pushed tensors,
`torch.distributed` update groups (trainer rank 0 + engines) and the weight checker.

Why:
- A push is validated against the served model BEFORE anything is written: every name must be a
  parameter (or persistent buffer) of the model with exactly that dtype and shape, else the whole
  push is refused with a message naming the tensor, and the engine keeps its weights and version.
- A distributed bucket is received even when it is refused (when its byte size is known), so the
  trainer's broadcast completes on every rank and the group stays usable; the received bytes are
  dropped.
- Groups are plain `ProcessGroupGloo` objects built on a `TCPStore` client with the caller's
  deadline, bound to the local address that routes to the master, so nothing is registered in
  torch's global state and a group that cannot rendezvous fails within its deadline and leaves
  nothing behind. Only `gloo` runs on CPU; `nccl` (SGLang's default) is refused with a clear error.
- Destroying a group wakes an update still waiting in one of its collectives (it answers 500 at once) and
  releases the group on a thread of its own: when a member died mid-push the trainer forms a new group
  with the survivors, and their next update must not wait behind the old one until its deadline.
- A trainer may ask (optional init field `weight_transport`: "auto") for the host-local shared-memory
  ring of slime.weights.ring: the engine maps the offered slots if it can and says so in its
  answer; the trainer's decision (ring for every engine, else broadcast) is read from the group's
  store at the first push. Without the field (slime's and SGLang's requests) nothing changes.
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
from dataclasses import dataclass, field

import torch

from slime.weights.ring import (
    BROADCAST,
    DECISION_KEY,
    HEADER_WORDS,
    MAGIC,
    OFFER_KEY,
    RING,
    TRANSPORTS,
    RingReader,
    RingUnavailable,
    bucket_digest,
    bucket_layout,
    chunks,
)
from slime.weights.transfer import (
    WeightFormatError,
    dtype_name,
    nbytes_of,
    parse_dtype,
    unflatten_bucket,
)

DEFAULT_GROUP_TIMEOUT_S = 120.0
DEFAULT_GLOO_THREADS = 8
GLOO_THREADS_ENV = "SLIME_WEIGHT_SYNC_GLOO_THREADS"


class WeightUpdateError(ValueError):
    """A refused update; the message names the tensor, group or field (the server answers 400)."""


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every name a trainer may push: parameters (tied ones under each of their names) and persistent buffers."""
    table = dict(model.named_parameters(remove_duplicate=False))
    modules = dict(model.named_modules())
    for name, buf in model.named_buffers(remove_duplicate=False):
        owner, _, local = name.rpartition(".")
        if local not in getattr(modules.get(owner), "_non_persistent_buffers_set", set()):
            table[name] = buf
    return table


def check_against_model(
    table: dict[str, torch.Tensor], names: list[str], dtypes: list[torch.dtype], shapes: list[list[int]]
) -> None:
    """Raise WeightUpdateError naming the first tensor the model does not have as (name, dtype, shape)."""
    for name, dtype, shape in zip(names, dtypes, shapes):
        target = table.get(name)
        if target is None:
            raise WeightUpdateError(f"tensor {name!r}: the served model has no such parameter")
        if target.dtype != dtype:
            raise WeightUpdateError(
                f"tensor {name!r}: dtype {dtype_name(dtype)} does not match the served "
                f"model's {dtype_name(target.dtype)}"
            )
        if list(target.shape) != list(shape):
            raise WeightUpdateError(
                f"tensor {name!r}: shape {list(shape)} does not match the served model's {list(target.shape)}"
            )


def parse_metadata(names, dtypes, shapes) -> tuple[list[str], list[torch.dtype], list[list[int]]]:
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise WeightUpdateError("names must be a list of non-empty strings")
    if not isinstance(dtypes, list) or not isinstance(shapes, list) or not len(names) == len(dtypes) == len(shapes):
        raise WeightUpdateError(
            f"names, dtypes and shapes must be lists of the same length, got "
            f"{len(names)}, {len(dtypes) if isinstance(dtypes, list) else dtypes!r}, "
            f"{len(shapes) if isinstance(shapes, list) else shapes!r}"
        )
    parsed_dtypes = []
    for name, d in zip(names, dtypes):
        try:
            parsed_dtypes.append(parse_dtype(d))
        except WeightFormatError as exc:
            raise WeightUpdateError(f"tensor {name!r}: {exc}") from None
    for name, s in zip(names, shapes):
        if not isinstance(s, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in s):
            raise WeightUpdateError(f"tensor {name!r}: shape must be a list of non-negative integers, got {s!r}")
    return names, parsed_dtypes, [list(s) for s in shapes]


def local_address_for(master_address: str, master_port: int) -> str:
    """The local IP the kernel would use to reach the master (a UDP connect sends no packet)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master_address, int(master_port)))
        return s.getsockname()[0]


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (torch's distributed errors carry a C++ trace after
    it), or its type name when it has none: what an error answer or a trainer's error quotes."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def gloo_threads() -> int:
    """Worker threads of a weight-update group: `SLIME_WEIGHT_SYNC_GLOO_THREADS`, else 8 (gloo's default
    is 2). Local to each process (peers need not agree; the wire protocol is the same): each thread
    carries one tensor's broadcast at a time, so with one broadcast per tensor more of them in flight
    keep the link busy through every per-tensor handshake (broadcast transport; bench/RESULTS.md)."""
    value = os.environ.get(GLOO_THREADS_ENV, "").strip()
    if not value:
        return DEFAULT_GLOO_THREADS
    if not value.isdigit() or int(value) < 1:
        raise WeightUpdateError(f"{GLOO_THREADS_ENV} must be a positive integer, got {value!r}")
    return int(value)


def new_store(master_address: str, master_port: int, world_size: int, timeout_s: float, *, is_master: bool):
    """The group's TCPStore (the master's is a server: it must live as long as the group)."""
    return torch.distributed.TCPStore(
        master_address,
        int(master_port),
        world_size,
        is_master,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def new_gloo_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    timeout_s: float,
    *,
    is_master: bool = False,
    store=None,
):
    """A gloo group on `tcp://master_address:master_port` (keys under `group_name`), bounded by `timeout_s`.

    Returns (process_group, store); the master's store must live as long as the group.
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = new_store(master_address, master_port, world_size, timeout_s, is_master=is_master)
    opts = torch.distributed.ProcessGroupGloo._Options()
    opts._timeout = timeout
    host = master_address if is_master else local_address_for(master_address, master_port)
    opts._devices = [torch.distributed.ProcessGroupGloo.create_device(hostname=host)]
    opts._threads = gloo_threads()
    pg = torch.distributed.ProcessGroupGloo(torch.distributed.PrefixStore(group_name, store), rank, world_size, opts)
    return pg, store


def all_reduce_done(pg) -> object:
    """The 1-word "slot done" collective of the ring (async: returns the work)."""
    return pg.allreduce([torch.zeros(1, dtype=torch.int64)])


@dataclass
class _Group:
    pg: object
    store: object
    rank: int
    world_size: int
    master: str
    scratch: torch.Tensor | None = None  # flat receive buffer, reused so later pushes do not page-fault
    transport: str = BROADCAST  # or RING, or "offered" (mapped, the trainer's decision not read yet)
    ring: RingReader | None = None
    seq: int = 0  # ring chunks received so far (the trainer numbers them the same way)
    broken: str | None = None  # why the ring protocol lost step with the trainer (the group must be re-formed)
    # set by destroy: a receive still waiting in a collective gives up at once (a member died; the
    # trainer forms a new group, and the next update must not wait behind this one)
    abandoned: bool = False
    _wakes: set = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def wait(self, *works) -> None:
        """Wait for this group's collectives (each ends by the group's deadline at the latest);
        RuntimeError at once when the group is destroyed meanwhile."""
        for work in works:
            wake, fut = threading.Event(), work.get_future()
            with self._lock:
                if self.abandoned:
                    raise RuntimeError("the group was destroyed while this update waited in it")
                self._wakes.add(wake)
            try:
                fut.add_done_callback(lambda _: wake.set())
                wake.wait()
            finally:
                with self._lock:
                    self._wakes.discard(wake)
            if not fut.done():
                raise RuntimeError("the group was destroyed while this update waited in it")
            work.wait()

    def abandon(self) -> None:
        with self._lock:
            self.abandoned = True
            for wake in self._wakes:
                wake.set()

    def flat_buffer(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        size = numel * torch.empty((), dtype=dtype).element_size()
        if self.scratch is None or self.scratch.numel() < size:
            self.scratch = torch.empty(-(-size // 64) * 64, dtype=torch.uint8)
        return self.scratch[:size].view(dtype)


@dataclass
class UpdateGroups:
    """The engine's weight-update groups by name (one engine may be in several, e.g. after a reconnect)."""

    groups: dict[str, _Group] = field(default_factory=dict)
    _pending: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def init(
        self,
        master_address,
        master_port,
        rank_offset,
        world_size,
        group_name,
        backend,
        timeout_s: float | None = None,
        weight_transport: str | None = None,
    ) -> dict:
        """Blocking (run it off the event loop). Returns the answer's fields (`message`, and
        `weight_transport` when the trainer asked for one); raises WeightUpdateError."""
        if not isinstance(master_address, str) or not master_address:
            raise WeightUpdateError("master_address (string) is required")
        for key, v in (("master_port", master_port), ("rank_offset", rank_offset), ("world_size", world_size)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise WeightUpdateError(f"{key} must be an integer, got {v!r}")
        if not 0 < master_port < 65536:
            raise WeightUpdateError(f"master_port must be in 1..65535, got {master_port}")
        if not 0 < rank_offset < world_size:
            raise WeightUpdateError(
                f"rank_offset must be in 1..world_size-1 (rank 0 is the trainer), got "
                f"{rank_offset} with world_size {world_size}"
            )
        if not isinstance(group_name, str) or not group_name:
            raise WeightUpdateError("group_name must be a non-empty string")
        if backend != "gloo":
            raise WeightUpdateError(
                f"backend {backend!r} is not available on the embedded CPU engine; use 'gloo' "
                "('nccl' is for SGLang engines on GPUs)"
            )
        if weight_transport is not None and weight_transport not in TRANSPORTS:
            raise WeightUpdateError(
                f"weight_transport must be one of {', '.join(TRANSPORTS)}, got {weight_transport!r}"
            )
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))):
            raise WeightUpdateError(f"timeout must be a number of seconds, got {timeout_s!r}")
        timeout_s = DEFAULT_GROUP_TIMEOUT_S if timeout_s is None else float(timeout_s)
        if timeout_s <= 0:
            raise WeightUpdateError(f"timeout must be > 0 seconds, got {timeout_s}")
        with self._lock:
            if group_name in self.groups or group_name in self._pending:
                raise WeightUpdateError(f"weight update group {group_name!r} already exists; destroy it first")
            self._pending.add(group_name)
        try:
            try:
                pg, store = new_gloo_group(master_address, master_port, rank_offset, world_size, group_name, timeout_s)
            except Exception as exc:  # noqa: BLE001 - torch raises several types (DistNetworkError, RuntimeError, ...)
                raise WeightUpdateError(
                    f"could not rendezvous with the trainer at {master_address}:{master_port} for group "
                    f"{group_name!r} (rank {rank_offset} of {world_size}, deadline {timeout_s:g} s): {first_line(exc)}"
                ) from None
            group = _Group(pg, store, rank_offset, world_size, f"{master_address}:{master_port}")
            answer = {
                "message": f"Initialized weight update group {group_name!r} (rank {rank_offset} of {world_size}, gloo)."
            }
            if weight_transport == "auto":
                answer.update(_map_offered_ring(group, group_name, timeout_s))
            elif weight_transport == BROADCAST:
                answer["weight_transport"] = BROADCAST
            with self._lock:
                self.groups[group_name] = group
        finally:
            with self._lock:
                self._pending.discard(group_name)
        return answer

    def destroy(self, group_name: str) -> str:
        with self._lock:
            group = self.groups.pop(group_name, None)
        if group is None:
            raise WeightUpdateError(f"weight update group {group_name!r} does not exist")
        _shutdown(group)
        return f"Destroyed weight update group {group_name!r}."

    def destroy_all(self) -> None:
        with self._lock:
            groups, self.groups = list(self.groups.values()), {}
        for g in groups:
            _shutdown(g)

    def uses_ring(self, group_name: str) -> bool:
        """Whether pushes on this group travel through the shared-memory ring (reads the trainer's
        decision at the first push after init; blocking, bounded by the store's deadline)."""
        with self._lock:
            group = self.groups.get(group_name)
        if group is None:
            return False
        if group.transport == "offered":
            try:
                decision = group.store.get(f"{group_name}/{DECISION_KEY}").decode()
            except Exception as exc:  # noqa: BLE001 - the trainer never decided (it died or is not slime's)
                raise RuntimeError(
                    f"group {group_name!r}: no transport decision from the trainer at {group.master}: {first_line(exc)}"
                ) from None
            group.transport = RING if decision == RING else BROADCAST
            if group.transport != RING:
                group.ring.close()
                group.ring = None
        return group.transport == RING

    def receive(
        self,
        group_name: str,
        names: list[str],
        dtypes: list[torch.dtype],
        shapes: list[list[int]],
        load_format: str | None,
        into: list[torch.Tensor] | None = None,
    ) -> list[tuple[str, torch.Tensor]]:
        """Blocking: receive one bucket broadcast by rank 0 in the layout `load_format` names.

        With `into` (per-tensor layout only) each tensor is received straight into its target (the
        model's parameters: no extra copy). A flattened bucket lands in the group's reused buffer: copy
        it out before the next receive."""
        with self._lock:
            group = self.groups.get(group_name)
        if group is None:
            raise WeightUpdateError(
                f"weight update group {group_name!r} does not exist; call init_weights_update_group first"
            )
        if load_format not in (None, "flattened_bucket"):
            raise WeightUpdateError(f"load_format must be null or 'flattened_bucket', got {load_format!r}")
        if self.uses_ring(group_name):
            _receive_ring(group, group_name, names, dtypes, shapes, into)
            return list(zip(names, into)) if into is not None else []
        if load_format == "flattened_bucket":
            if len(set(dtypes)) > 1:
                raise WeightUpdateError(
                    f"a flattened_bucket must hold tensors of one dtype, got {sorted({dtype_name(d) for d in dtypes})}"
                )
            numel = sum(nbytes_of(d, s) // torch.empty((), dtype=d).element_size() for d, s in zip(dtypes, shapes))
            flat = group.flat_buffer(dtypes[0] if dtypes else torch.uint8, numel)
            _checked_broadcast(group, group_name, flat)
            return list(zip(names, unflatten_bucket(flat, shapes)))
        tensors = into if into is not None else [torch.empty(s, dtype=d) for d, s in zip(dtypes, shapes)]
        _checked_broadcast(group, group_name, *tensors)
        return list(zip(names, tensors))


def _checked_broadcast(group: _Group, group_name: str, *t: torch.Tensor) -> None:
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank = 0
    try:
        group.wait(*[group.pg.broadcast([x], opts) for x in t])
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"broadcast on group {group_name!r} from {group.master} failed: {first_line(exc)}") from None


def _map_offered_ring(group: _Group, group_name: str, timeout_s: float) -> dict:
    """Map the trainer's ring offer (see weight_ring); the answer says whether this engine can use it."""
    try:
        offer = group.store.get(f"{group_name}/{OFFER_KEY}")
        group.ring = RingReader.map(offer)
    except RingUnavailable as exc:
        return {"weight_transport": BROADCAST, "weight_transport_reason": str(exc)}
    except Exception as exc:  # noqa: BLE001 - no offer within the deadline: the trainer falls back too
        return {"weight_transport": BROADCAST, "weight_transport_reason": f"no ring offer: {first_line(exc)}"}
    group.transport = "offered"
    return {"weight_transport": RING}


def _receive_ring(
    group: _Group,
    group_name: str,
    names: list[str],
    dtypes: list[torch.dtype],
    shapes: list[list[int]],
    into: list[torch.Tensor] | None,
) -> None:
    """Receive one bucket chunk by chunk through the ring, copying into `into` (None: drop it, the
    bucket was refused but the collectives must still run). Blocking, bounded by the group's deadline."""
    if group.broken:
        raise RuntimeError(
            f"group {group_name!r} lost step with the trainer earlier ({group.broken}); destroy it and init again"
        )
    offsets, sizes, total = bucket_layout(dtypes, shapes)
    digest = bucket_digest(names, dtypes, shapes)
    ring, done = group.ring, []
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank = 0
    try:
        for start, length in chunks(total, ring.slot_bytes):
            hdr = torch.zeros(HEADER_WORDS, dtype=torch.int64)
            group.wait(group.pg.broadcast([hdr], opts))
            expected = [MAGIC, group.seq, group.seq % len(ring.slots), start, length, digest]
            if hdr.tolist() != expected:
                raise RuntimeError(
                    f"ring chunk header {hdr.tolist()} from the trainer does not match this request "
                    f"(expected {expected}: the trainer sent another bucket than the one starting "
                    f"at {names[0]!r})"
                )
            if into is not None:
                ring.read(expected[2], into, offsets, sizes, start, length)
            group.seq += 1
            done.append(all_reduce_done(group.pg))
        group.wait(*done)
    except Exception as exc:  # noqa: BLE001
        group.broken = first_line(exc)
        raise RuntimeError(
            f"shared-memory ring receive on group {group_name!r} from {group.master} failed at "
            f"the bucket starting at {names[0]!r}: {group.broken}"
        ) from None


def _shutdown(group: _Group) -> None:
    """Wake any update waiting in the group, then release it. The release runs on its own thread: with
    a collective still pending (a member died) gloo waits for it up to the group's deadline, and the
    caller (the server's event loop) must not."""
    group.abandon()
    threading.Thread(target=_release, args=(group,), daemon=True, name="weight-group-release").start()


def _release(group: _Group) -> None:
    """Abort the group, then free it here: freeing a gloo group joins its worker threads (up to the
    group's deadline when one is still in a collective with a dead member), so the group's only
    reference is taken off the `_Group` first (freed by the decode thread, it would stop decoding)."""
    pg, group.pg = group.pg, None
    try:
        pg.abort()
    except Exception:  # noqa: BLE001 - already broken groups may refuse; nothing else to release
        pass
    del pg
    if group.ring is not None:  # after the collectives: no receive copies from it any more
        group.ring.close()
        group.ring = None


class WeightChecker:
    """slime's `check_weights(action)`: snapshot / compare / reset, by SHA-256 per tensor."""

    ACTIONS = ("snapshot", "compare", "compare_checksum", "checksum", "reset", "reset_tensors")

    def __init__(self) -> None:
        self.snapshot: dict[str, str] | None = None

    @staticmethod
    def compare(actual: dict[str, str], expected: dict[str, str]) -> dict:
        tensors = {name: actual.get(name) == digest for name, digest in expected.items()}
        mismatched = sorted(n for n, ok in tensors.items() if not ok and n in actual)
        missing = sorted(n for n in expected if n not in actual)
        equal = not mismatched and not missing
        if equal:
            message = f"all {len(tensors)} tensors are equal"
        else:
            parts = []
            if mismatched:
                parts.append(
                    f"{len(mismatched)} differ ({', '.join(mismatched[:5])}{', ...' if len(mismatched) > 5 else ''})"
                )
            if missing:
                parts.append(f"{len(missing)} missing in the engine ({', '.join(missing[:5])})")
            message = f"weights differ from the expected checksums: {'; '.join(parts)}"
        return {
            "success": equal,
            "equal": equal,
            "message": message,
            "tensors": tensors,
            "mismatched": mismatched,
            "missing": missing,
        }
