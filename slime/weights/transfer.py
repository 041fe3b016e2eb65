"""The wire format of weight pushes, shared by the trainer (sender) and the embedded engine (receiver).

Why these choices:
- Tensor path (`update_weights_from_tensor`, colocated trainers): on GPUs SGLang passes CUDA IPC
  handles; on CPU we pass **shared memory** by default. The trainer packs a bucket's tensors into
  one file under /dev/shm (one memcpy), every engine on the host maps it read-only and copies
  straight into its parameters (one memcpy each); the JSON body carries only names, dtypes, shapes
  and offsets. By value (`transport="inline"`: the same bytes base64-encoded in the body) also
  works across hosts, but costs base64 + JSON + an HTTP body of 4/3 the model size per engine
  (measured ~12x slower for SmolLM2-135M, bench/bench_weight_sync.py), so it is the fallback. Both are plain bytes plus JSON: nothing is unpickled, unlike
  SGLang's `MultiprocessingSerializer`, so a request can never run code in the engine.
- The engine only maps files named `slime-weights-*` directly inside the shared-memory directory,
  so a request cannot make it read arbitrary files. The sender owns the file and unlinks it when the
  push is done (`TensorPayload` is a context manager); a mapping keeps its data alive until the
  engine has copied it.
- Distributed path: tensors travel by `torch.distributed` broadcast; a bucket is either one flat
  buffer (`load_format="flattened_bucket"`: all tensors of one dtype concatenated in order, SGLang's
  `FlattenedTensorBucket` layout) or one broadcast per tensor (`load_format=None`, SGLang's default).
  `bucket_named_tensors` makes single-dtype buckets so both layouts work.
- Checksums are SHA-256 of a tensor's raw bytes (contiguous, CPU), as SGLang's weight checker
  computes them, so a trainer and an engine agree when and only when the bytes are identical.
"""

from __future__ import annotations

import base64
import hashlib
import json
import mmap
import os
import tempfile
import uuid
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

FORMAT = "slime-tensors-v1"
SHM_PREFIX = "slime-weights-"
_ALIGN = 64  # every tensor starts on a 64-byte boundary, so typed views of the buffer are legal
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)

_DTYPES = {
    name: getattr(torch, name)
    for name in (
        "float32",
        "float16",
        "bfloat16",
        "float64",
        "int8",
        "uint8",
        "int16",
        "int32",
        "int64",
        "bool",
        "float8_e4m3fn",
        "float8_e5m2",
    )
    if hasattr(torch, name)
}


class WeightFormatError(ValueError):
    """A payload that does not follow this format; the message names the field or tensor."""


def dtype_name(dtype: torch.dtype) -> str:
    """torch.float32 -> "float32" (slime sends `str(dtype).replace("torch.", "")`)."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if not isinstance(name, str) or name.removeprefix("torch.") not in _DTYPES:
        raise WeightFormatError(f"unknown dtype {name!r} (expected one of {sorted(_DTYPES)})")
    return _DTYPES[name.removeprefix("torch.")]


def nbytes_of(dtype: torch.dtype, shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n * torch.empty((), dtype=dtype).element_size()


def tensor_checksum(t: torch.Tensor) -> str:
    """SHA-256 of the tensor's bytes (SGLang's weight-checker hash)."""
    t = t.detach().cpu().contiguous()
    return hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy()).hexdigest()


def named_checksums(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    return {name: tensor_checksum(t) for name, t in named_tensors}


def bucket_named_tensors(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive tensors grouped into buckets of at most `bucket_bytes` (a larger tensor is a bucket
    of its own) and of one dtype, in order."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named_tensors:
        n = t.numel() * t.element_size()
        if bucket and (size + n > bucket_bytes or t.dtype != bucket[0][1].dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


def unflatten_bucket(flat: torch.Tensor, shapes: list[list[int]]) -> list[torch.Tensor]:
    out, start = [], 0
    for shape in shapes:
        n = 1
        for d in shape:
            n *= int(d)
        out.append(flat[start : start + n].view(*shape) if shape else flat[start : start + n].view(()))
        start += n
    return out


# ------------------------------------------------------------------ tensor payloads
def shm_dir() -> Path:
    return Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())


def _layout(named_tensors: list[tuple[str, torch.Tensor]]) -> tuple[list[dict], int]:
    entries, offset = [], 0
    for name, t in named_tensors:
        if not isinstance(name, str) or not name:
            raise WeightFormatError(f"tensor names must be non-empty strings, got {name!r}")
        entries.append({"name": name, "dtype": dtype_name(t.dtype), "shape": list(t.shape), "offset": offset})
        offset += -(-(t.numel() * t.element_size()) // _ALIGN) * _ALIGN
    return entries, offset


def _write(buf: torch.Tensor, named_tensors: list[tuple[str, torch.Tensor]], entries: list[dict]) -> None:
    """One single-threaded memcpy per tensor (numpy): torch's parallel copy waits for its slowest thread
    at every tensor, several times slower on a busy host (bench/bench_weight_sync.py)."""
    out = buf.numpy()
    for (_, t), e in zip(named_tensors, entries):
        n = t.numel() * t.element_size()
        if n:
            src = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
            np.copyto(out[e["offset"] : e["offset"] + n], src)


@dataclass
class TensorPayload:
    """One serialised bucket: `serialized` is the string to send; `close()` frees its shared memory."""

    serialized: str
    path: Path | None = None
    nbytes: int = 0

    def close(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None

    def __enter__(self) -> TensorPayload:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serialize_named_tensors(
    named_tensors: Iterable[tuple[str, torch.Tensor]], *, transport: str = "shm"
) -> TensorPayload:
    """Pack named tensors for `update_weights_from_tensor` (`transport` "shm" or "inline", see module doc)."""
    named = [(n, t) for n, t in named_tensors]
    entries, total = _layout(named)
    header = {"format": FORMAT, "transport": transport, "nbytes": total, "tensors": entries}
    if transport == "inline":
        buf = torch.zeros(total, dtype=torch.uint8)
        _write(buf, named, entries)
        header["data"] = base64.b64encode(buf.numpy().tobytes()).decode("ascii")
        return TensorPayload(json.dumps(header), nbytes=total)
    if transport != "shm":
        raise WeightFormatError(f"transport must be 'shm' or 'inline', got {transport!r}")
    path = shm_dir() / f"{SHM_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, max(total, 1))
        # MAP_POPULATE: the kernel allocates all pages at once (page-faulting 4 KB at a time is several x slower)
        with mmap.mmap(fd, max(total, 1), flags=mmap.MAP_SHARED | _POPULATE) as mm:
            buf = torch.frombuffer(mm, dtype=torch.uint8)
            _write(buf, named, entries)
            del buf
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    header["path"] = str(path)
    return TensorPayload(json.dumps(header), path=path, nbytes=total)


def deserialize_named_tensors(serialized: str) -> list[tuple[str, torch.Tensor]]:
    """Engine side: the named tensors of a payload (views of a read-only mapping or of the decoded
    bytes: copy them into the model, never write them)."""
    try:
        header = json.loads(serialized)
    except (TypeError, json.JSONDecodeError) as exc:
        raise WeightFormatError(f"serialized_named_tensors item is not a {FORMAT} JSON payload: {exc}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise WeightFormatError(
            f"serialized_named_tensors item has format "
            f"{header.get('format') if isinstance(header, dict) else None!r}, expected {FORMAT!r}"
        )
    entries = header.get("tensors")
    total = header.get("nbytes")
    if not isinstance(entries, list) or not isinstance(total, int) or total < 0:
        raise WeightFormatError("payload needs 'tensors' (list) and 'nbytes' (int >= 0)")
    if header.get("transport") == "inline":
        data = header.get("data")
        if not isinstance(data, str):
            raise WeightFormatError("inline payload needs 'data' (base64 string)")
        raw = bytearray(base64.b64decode(data, validate=True))
        if len(raw) != total:
            raise WeightFormatError(f"inline payload has {len(raw)} bytes, header says {total}")
        buf = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    elif header.get("transport") == "shm":
        buf = _map_shm(header.get("path"), total)
    else:
        raise WeightFormatError(f"payload transport must be 'shm' or 'inline', got {header.get('transport')!r}")
    out = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or not isinstance(e.get("offset"), int):
            raise WeightFormatError(f"tensors[{i}] needs name (str), dtype, shape, offset (int)")
        shape = e.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise WeightFormatError(f"tensor {e['name']!r}: shape must be a list of non-negative integers")
        dtype = parse_dtype(e.get("dtype"))
        n = nbytes_of(dtype, shape)
        start = e["offset"]
        if start < 0 or start % _ALIGN or start + n > total:
            raise WeightFormatError(
                f"tensor {e['name']!r}: bytes [{start}, {start + n}) outside the payload of {total} bytes or misaligned"
            )
        out.append((e["name"], buf[start : start + n].view(dtype).view(shape)))
    return out


def _map_shm(path: object, total: int) -> torch.Tensor:
    if not isinstance(path, str):
        raise WeightFormatError("shm payload needs 'path' (string)")
    p = Path(path)
    if p.parent.resolve() != shm_dir().resolve() or not p.name.startswith(SHM_PREFIX) or "/" in p.name:
        raise WeightFormatError(f"shm payload path {path!r} must be a {SHM_PREFIX}* file directly in {shm_dir()}")
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise WeightFormatError(
            f"cannot open shm payload {path}: {exc.strerror} (the trainer must keep it until every engine has answered)"
        ) from None
    try:
        size = os.fstat(fd).st_size
        if size < total:
            raise WeightFormatError(f"shm payload {path} has {size} bytes, header says {total}")
        if total == 0:
            return torch.empty(0, dtype=torch.uint8)
        return map_read_only(fd, total)
    finally:
        os.close(fd)


def map_read_only(fd: int, size: int) -> torch.Tensor:
    """The first `size` bytes of the shared file `fd` as a uint8 tensor that keeps the mapping alive
    (the descriptor may be closed afterwards). Read-only on purpose: the engine only copies out of it."""
    mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return torch.frombuffer(mm, dtype=torch.uint8)
