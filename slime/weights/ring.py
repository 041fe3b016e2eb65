"""Host-local data plane of the distributed weight path: a ring of shared-memory slots.

Why: when the trainer and every engine of a weight-update group share a host (as NCCL's shared-memory
transport does within a node), sending the bytes over loopback TCP costs a socket copy per engine and
hop; instead rank 0 copies each chunk of a bucket once into a slot of a ring mapped by every member,
and each engine copies it once, straight into its parameters. The group's collectives carry only a
6-word "chunk ready" header (broadcast from rank 0) and a 1-word "slot done" allreduce, so the
ordering, the deadlines and the failure detection stay torch.distributed's.

How a ring is agreed (slime.weights.push / weight_updates drive it):
1. Rank 0 creates `slots` files `slime-weights-<pid>-ring-<random>` under the shared-memory directory,
   fills them (pages allocated once, never page-faulted again), writes a random token at the start
   of each, and publishes an *offer* (paths, sizes, token, host id) in the group's store.
2. An engine asked for it maps the offered files read-only, only if the host id is its own, each
   name follows the `slime-weights-*` rule, and each file holds the token (proof it is the same
   shared memory, not a same-named file elsewhere); it answers whether it could.
3. Rank 0 unlinks the files as soon as every engine has answered (nothing is left on disk even if
   the trainer is killed later; the mappings keep the memory) and publishes the decision: the ring
   only if every engine mapped it, else the plain broadcast for the whole group.

A bucket's byte stream is its tensors laid out at 64-byte aligned offsets (`bucket_layout`); it
travels in chunks of at most one slot, so any bucket size works with a small ring and rank 0 writes
chunk k+1 while the engines copy chunk k.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from slime.weights.transfer import SHM_PREFIX, dtype_name, map_read_only, nbytes_of, shm_dir

OFFER_KEY = "slime/shm-ring/offer"
DECISION_KEY = "slime/shm-ring/decision"
RING, BROADCAST = "shm_ring", "broadcast"
TRANSPORTS = ("auto", BROADCAST)  # what a trainer may ask for: try the ring (fall back), or never
MAGIC = 0x51_1E_57_EE  # first word of every chunk header
HEADER_WORDS = 6  # magic, chunk sequence number, slot, start byte, length, bucket digest
DEFAULT_SLOTS = 4
DEFAULT_SLOT_BYTES = 64 << 20
_ALIGN = 64
_TOKEN_BYTES = 32
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


class RingUnavailable(RuntimeError):
    """This engine cannot use the offered ring (another host, files not visible, bad offer): the reason."""


def host_id() -> str:
    """Identity of this machine's running kernel (boot id), hostname as a fallback."""
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return socket.gethostname()


def bucket_layout(dtypes: list[torch.dtype], shapes: list[list[int]]) -> tuple[list[int], list[int], int]:
    """(offsets, sizes, total) in bytes of a bucket's tensors, each at a 64-byte aligned offset."""
    offsets, sizes, pos = [], [], 0
    for dtype, shape in zip(dtypes, shapes):
        n = nbytes_of(dtype, shape)
        offsets.append(pos)
        sizes.append(n)
        pos += -(-n // _ALIGN) * _ALIGN
    return offsets, sizes, pos


def bucket_digest(names: list[str], dtypes: list[torch.dtype], shapes: list[list[int]]) -> int:
    """63-bit digest of a bucket's metadata: the trainer's chunk headers and the engine's request must agree."""
    text = json.dumps([list(names), [dtype_name(d) for d in dtypes], [list(map(int, s)) for s in shapes]])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def chunks(total: int, slot_bytes: int) -> list[tuple[int, int]]:
    """(start, length) of each chunk of a `total`-byte bucket."""
    return [(start, min(slot_bytes, total - start)) for start in range(0, total, slot_bytes)]


def header(seq: int, slot: int, start: int, length: int, digest: int) -> torch.Tensor:
    return torch.tensor([MAGIC, seq, slot, start, length, digest], dtype=torch.int64)


def _bytes(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a numpy view (shares memory; any dtype, bfloat16 included)."""
    return t.detach().reshape(-1).view(torch.uint8).numpy()


def _copy_chunk(
    slot: torch.Tensor,
    tensors: list[torch.Tensor],
    offsets: list[int],
    sizes: list[int],
    start: int,
    length: int,
    *,
    into_slot: bool,
) -> None:
    """Copy the bytes [start, start + length) of the bucket between its tensors and a slot.

    A plain single-threaded memcpy (numpy, GIL released): torch's intra-op parallel copy splits every
    tensor across its threads and, on a busy host, waits for the slowest one at each tensor (measured
    5x slower with 2 threads on the 2-core bench box); the engines copy concurrently anyway."""
    ring = slot.numpy()
    end = start + length
    for t, off, n in zip(tensors, offsets, sizes):
        lo, hi = max(start, off), min(end, off + n)
        if lo >= hi:
            continue
        if into_slot:
            np.copyto(ring[lo - start : hi - start], _bytes(t.contiguous())[lo - off : hi - off])
        elif t.is_contiguous():
            np.copyto(_bytes(t)[lo - off : hi - off], ring[lo - start : hi - start])
        else:  # a strided parameter (never in HF models): write through a contiguous copy
            flat = t.detach().contiguous()
            np.copyto(_bytes(flat)[lo - off : hi - off], ring[lo - start : hi - start])
            with torch.no_grad():
                t.copy_(flat)


@dataclass
class RingWriter:
    """Rank 0's side: the slot files, mapped read-write (see the module doc for their life cycle)."""

    paths: list[Path]
    slot_bytes: int
    token: bytes
    _maps: list[mmap.mmap] = field(default_factory=list, repr=False)
    slots: list[torch.Tensor] = field(default_factory=list, repr=False)

    @classmethod
    def create(cls, num_slots: int = DEFAULT_SLOTS, slot_bytes: int = DEFAULT_SLOT_BYTES) -> RingWriter:
        if num_slots < 2 or slot_bytes < _ALIGN or slot_bytes % _ALIGN:
            raise ValueError(
                f"a ring needs >= 2 slots of a positive multiple of {_ALIGN} bytes, got {num_slots} x {slot_bytes}"
            )
        ring = cls(paths=[], slot_bytes=slot_bytes, token=secrets.token_bytes(_TOKEN_BYTES))
        try:
            for _ in range(num_slots):
                path = shm_dir() / f"{SHM_PREFIX}{os.getpid()}-ring-{secrets.token_hex(16)}"
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                ring.paths.append(path)
                try:
                    os.ftruncate(fd, slot_bytes)
                    # MAP_POPULATE allocates every page now: no push ever page-faults on the ring
                    mm = mmap.mmap(fd, slot_bytes, flags=mmap.MAP_SHARED | _POPULATE)
                finally:
                    os.close(fd)
                ring._maps.append(mm)
                slot = torch.frombuffer(mm, dtype=torch.uint8)
                slot[:_TOKEN_BYTES].copy_(torch.frombuffer(bytearray(ring.token), dtype=torch.uint8))
                ring.slots.append(slot)
        except BaseException:
            ring.close()
            raise
        return ring

    def offer(self) -> str:
        return json.dumps(
            {
                "host": host_id(),
                "paths": [str(p) for p in self.paths],
                "slot_bytes": self.slot_bytes,
                "token": self.token.hex(),
            }
        )

    def unlink(self) -> None:
        """Remove the files (the mappings, ours and the engines', keep the memory until closed)."""
        for p in self.paths:
            p.unlink(missing_ok=True)

    def write(
        self, slot: int, tensors: list[torch.Tensor], offsets: list[int], sizes: list[int], start: int, length: int
    ) -> None:
        _copy_chunk(self.slots[slot], tensors, offsets, sizes, start, length, into_slot=True)

    def close(self) -> None:
        self.unlink()
        self.slots.clear()
        for mm in self._maps:
            with contextlib.suppress(BufferError):  # a view still alive elsewhere: the GC closes it later
                mm.close()
        self._maps.clear()


@dataclass
class RingReader:
    """An engine's side: the offered slots, mapped read-only (never anything else)."""

    slot_bytes: int
    slots: list[torch.Tensor] = field(default_factory=list, repr=False)

    @classmethod
    def map(cls, offer_text: str | bytes) -> RingReader:
        """Map the offered ring, or raise RingUnavailable saying why (the group then uses the broadcast)."""
        try:
            offer = json.loads(offer_text)
            paths, slot_bytes, token = offer["paths"], offer["slot_bytes"], bytes.fromhex(offer["token"])
            host = offer["host"]
        except (ValueError, KeyError, TypeError) as exc:
            raise RingUnavailable(f"malformed ring offer: {exc}") from None
        if host != host_id():
            raise RingUnavailable("the trainer runs on another host")
        if not (
            isinstance(paths, list)
            and len(paths) >= 2
            and isinstance(slot_bytes, int)
            and slot_bytes > 0
            and len(token) == _TOKEN_BYTES
        ):
            raise RingUnavailable("malformed ring offer: needs >= 2 paths, slot_bytes > 0 and a 32-byte token")
        ring = cls(slot_bytes=slot_bytes)
        for path in paths:
            ring.slots.append(_map_slot(path, slot_bytes))
            if bytes(ring.slots[-1][:_TOKEN_BYTES].numpy()) != token:
                raise RingUnavailable(f"{path} is not the trainer's ring (token differs)")
        return ring

    def read(
        self, slot: int, tensors: list[torch.Tensor], offsets: list[int], sizes: list[int], start: int, length: int
    ) -> None:
        _copy_chunk(self.slots[slot], tensors, offsets, sizes, start, length, into_slot=False)

    def close(self) -> None:
        self.slots.clear()  # the mappings go with their last view


def _map_slot(path: object, size: int) -> torch.Tensor:
    if not isinstance(path, str):
        raise RingUnavailable(f"ring path {path!r} is not a string")
    p = Path(path)
    if p.parent != shm_dir() or not p.name.startswith(SHM_PREFIX):
        raise RingUnavailable(f"ring path {path!r} must be a {SHM_PREFIX}* file directly in {shm_dir()}")
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise RingUnavailable(f"cannot open {path}: {exc.strerror} (not the trainer's shared memory)") from None
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000 == 0o100000 and st.st_size == size):
            raise RingUnavailable(f"{path} is not a regular file of {size} bytes")
        return map_read_only(fd, size)
    finally:
        os.close(fd)
