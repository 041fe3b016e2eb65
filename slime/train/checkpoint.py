"""The trainer's checkpoint on disk: layout, atomic commit, manifest, and the check `--load` runs first.

`{--save}/iter_{rollout_id:07d}/` holds `model/` (HF safetensors + tokenizer), `optimizer.pt`,
`trainer_state.json`, the data source's state of the same rollout (`rollout_state_{id}.json`, so
model and data are one unit) and, written last, `manifest.json` (every file's size, sha256 and
format, and the model it was trained from). It is built in a staging directory and renamed into
place; then `latest_checkpointed_iteration.txt` moves. A crash at any point leaves the previous
checkpoint current and complete. Preflight verifies a checkpoint before Ray starts: sizes, hashes,
formats, and each tensor file opened by the library the trainer loads it with (torch is imported
only then, `loader_problem`): a byte the zip CRCs do not cover passed every other check once.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
import zipfile
from pathlib import Path
from typing import Any

from slime.utils.atomic_file import write_atomic

CHECKPOINT_TRACKER = "latest_checkpointed_iteration.txt"  # Megatron's name for the newest checkpoint
MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
# config.json fields that make two models the same architecture (the trainer loads one into the other's place)
IDENTITY_FIELDS = (
    "architectures",
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)
HASH_CHUNK = 8 << 20  # bytes read per hash update
DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
}  # safetensors' dtypes


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or loaded; the message names the flag and the file."""


def checkpoint_dir(root: str | Path, rollout_id: int) -> Path:
    return Path(root) / f"iter_{rollout_id:07d}"


def data_state_name(rollout_id: int) -> str:
    """The data source's file name for the state saved after `rollout_id` (DataSource.save's)."""
    return f"rollout_state_{rollout_id}.json"


def data_state_dir(root: str | Path, rollout_id: int) -> str | None:
    """Where the data state that goes with the model of `rollout_id` is: inside its checkpoint (None:
    a checkpoint without one, whose data state is `{root}/rollout_state_{id}.json`)."""
    ckpt = checkpoint_dir(root, rollout_id)
    return str(ckpt) if (ckpt / data_state_name(rollout_id)).is_file() else None


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def format_problem(path: Path) -> str | None:
    """Why `path` is not a whole file of its format (None: it is): safetensors' header must parse and
    its tensors end exactly at the file's end; a torch `.pt` is a zip with its central directory at
    the end; JSON must parse. Truncation breaks all three."""
    size = path.stat().st_size
    if path.suffix == ".safetensors":
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{size} bytes, shorter than a safetensors header"
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                return f"safetensors header of {n} bytes in a file of {size}"
            try:
                header = json.loads(f.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                return "safetensors header is not JSON"
        ends = tensor_ends(header)
        if ends is None:
            return "safetensors header is not a map of tensors whose dtype, shape and data_offsets agree"
        end = max(ends, default=0)
        return None if 8 + n + end == size else f"{size} bytes, its tensors need {8 + n + end} (truncated)"
    if path.suffix in (".pt", ".bin"):
        return torch_archive_problem(path, size)
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            return f"not valid JSON ({e})"
        return json_shape_problem(path.name, data)
    return None


def tensor_ends(header: Any) -> list[int] | None:
    """Where each tensor of a safetensors header ends (None: the header is not of that shape)."""
    if not isinstance(header, dict):
        return None
    ends = []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        offsets = t.get("data_offsets") if isinstance(t, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(_is_count(x) for x in offsets)
            and offsets[1] - offsets[0] == tensor_bytes(t)
        ):
            return None
        ends.append(offsets[1])
    return ends


def tensor_bytes(t: dict[str, Any]) -> int | None:
    """The bytes a header entry's dtype and shape need (None: not a dtype and shape)."""
    shape, width = t.get("shape"), DTYPE_BYTES.get(t.get("dtype"))
    if width is None or not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        return None
    return width * math.prod(shape)


def torch_archive_problem(path: Path, size: int) -> str | None:
    """A torch `.pt` is a zip holding `<name>/data.pkl`; its central directory is at the end."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            if not any(n.endswith("data.pkl") for n in names):
                return "a zip archive, but not torch's (no data.pkl)"
            # torch writes no file attributes and one disk; a changed attribute byte (outside every
            # CRC) made torch.load fail, or not, at random (miniz reads it as a directory flag)
            odd = next((i for i in z.infolist() if i.external_attr or i.internal_attr or i.volume), None)
            if odd is not None:
                return f"{odd.filename!r} in it has zip attributes torch never writes (corrupted)"
            bad = z.testzip()  # every member against its CRC-32: a byte changed after torch wrote it
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError):
        return f"{size} bytes, not a whole torch zip archive (truncated or corrupted)"
    return f"{bad!r} in it fails its CRC-32 (corrupted)" if bad else None


def json_shape_problem(name: str, data: Any) -> str | None:
    """What the loaders read from the checkpoint's JSON files: objects, with a count where one is read."""
    if name in ("trainer_state.json", "config.json", MANIFEST) and not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    if name == "trainer_state.json" and not _is_count(data.get("global_step", 0)):
        return f"'global_step' must be a non-negative integer, got {data.get('global_step')!r:.40}"
    if name == MANIFEST:
        return manifest_problem(data)
    return None


def manifest_problem(manifest: dict[str, Any]) -> str | None:
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return f"'files' must be an object listing the checkpoint's files, got {files!r:.60}"
    for name, entry in files.items():
        if name.startswith("/") or ".." in Path(name).parts or "\x00" in name:
            return f"'files' names {name!r:.60}, outside the checkpoint"
        if not (isinstance(entry, dict) and _is_count(entry.get("size")) and isinstance(entry.get("sha256"), str)):
            return f'\'files\'[{name!r:.60}] must be {{"size": bytes, "sha256": hex}}, got {entry!r:.60}'
    return None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def model_identity(model_dir: str | Path) -> dict[str, Any]:
    """The architecture fields of a HF model's config.json (empty when there is none)."""
    config = Path(model_dir) / "config.json"
    if not config.is_file():
        return {}
    data = json.loads(config.read_text(encoding="utf-8"))
    return {k: data.get(k) for k in IDENTITY_FIELDS if k in data}


def describe_identity(identity: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in identity.items()) or "no config.json"


class CheckpointWriter:
    """Stage one checkpoint's files in `iter_X.staging-PID`, then `commit` (manifest, rename, tracker)
    or `discard`. Only the process holding the `--save` lock writes there."""

    def __init__(self, root: str | Path, rollout_id: int):
        self.root, self.rollout_id = Path(root), rollout_id
        self.final = checkpoint_dir(root, rollout_id)
        self.staging = self.final.with_name(f"{self.final.name}.staging-{os.getpid()}")
        for stale in self.root.glob(f"{self.final.name}.staging-*"):  # left by a crashed writer of this id
            shutil.rmtree(stale, ignore_errors=True)
        self.staging.mkdir(parents=True)

    def add_data_state(self) -> bool:
        """Copy the data source's state of this rollout in (saved by the manager before); False if none."""
        src = self.root / data_state_name(self.rollout_id)
        if not src.is_file():
            return False
        shutil.copyfile(src, self.staging / src.name)
        return True

    def commit(self, base_model: str | None, meta: dict[str, Any]) -> Path:
        files = {}
        for path in sorted(p for p in self.staging.rglob("*") if p.is_file()):
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            files[str(path.relative_to(self.staging))] = {"size": path.stat().st_size, "sha256": sha256_of(path)}
        manifest = {
            "version": MANIFEST_VERSION,
            "rollout_id": self.rollout_id,
            "base_model": base_model,
            "base_identity": model_identity(base_model) if base_model else {},
            **meta,
            "files": files,
        }
        write_atomic(self.staging / MANIFEST, json.dumps(manifest, indent=1), durable=True)
        old = self.final.with_name(f"{self.final.name}.replaced-{os.getpid()}")
        if self.final.exists():  # the same id saved again (a resumed run): keep it until the new one is in
            self.final.replace(old)
        self.staging.replace(self.final)
        write_atomic(self.root / CHECKPOINT_TRACKER, str(self.rollout_id), durable=True)
        shutil.rmtree(old, ignore_errors=True)
        return self.final

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


def tracked_rollout_id(root: str | Path, flag: str = "--load") -> int | None:
    """The rollout id `latest_checkpointed_iteration.txt` names (None: no model checkpoint there)."""
    tracker = Path(root) / CHECKPOINT_TRACKER
    if not tracker.is_file():
        return None
    text = tracker.read_text(errors="replace").strip()
    if not (text.isascii() and text.isdigit()):
        raise CheckpointError(f"{flag} {root}: {tracker} holds {text[:40]!r}, expected a rollout id")
    return int(text)


def latest_checkpoint(root: str | Path, step: int | None = None) -> int | None:
    """The rollout id of the checkpoint `--load` resumes from (`--ckpt-step`, else the newest)."""
    if step is not None:
        if not (checkpoint_dir(root, step) / "model").is_dir():
            raise CheckpointError(f"--ckpt-step {step}: no checkpoint {checkpoint_dir(root, step)} under --load {root}")
        return step
    return tracked_rollout_id(root)


def loader_problem(path: Path) -> str | None:
    """Why the trainer's loader would refuse `path` (None: it reads it): a torch archive through
    `torch.load` (memory-mapped: the structure is parsed, the tensors' bytes are the hashes' and CRCs'
    business), a safetensors file through safetensors' own header parser."""
    try:
        if path.suffix in (".pt", ".bin"):
            import torch

            torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        elif path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    f.get_slice(key)
    except Exception as e:  # noqa: BLE001 - whatever the loader raises, named with the file
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return f"the trainer's loader refuses it ({type(e).__name__}: {first})"
    return None


def verify_checkpoint(
    root: str | Path, rollout_id: int, *, hashes: bool = True, without_manifest: bool = False
) -> dict[str, Any]:
    """Check `iter_X` against its manifest (every file present, same size, same sha256, whole format,
    readable by the trainer's loaders). A checkpoint without a manifest is refused: nothing then says
    its files are the ones written (a deleted manifest hid 16 flipped bytes in the weights, which
    were trained on and pushed); `without_manifest` (--load-without-manifest) accepts one on the
    format and loader checks alone. Returns the manifest (`{}` without one); raises CheckpointError
    naming `--load` and the file."""
    ckpt = checkpoint_dir(root, rollout_id)
    where = f"--load {root}: the checkpoint of rollout {rollout_id}"
    if not ckpt.is_dir():
        kept = sorted(ckpt.parent.glob(f"{ckpt.name}.replaced-*"))
        hint = f"; a crash while saving it again left the previous copy {kept[-1]}: rename it to {ckpt}" if kept else ""
        raise CheckpointError(f"{where} is missing: {ckpt} does not exist{hint}")
    manifest_path = ckpt / MANIFEST
    if not manifest_path.is_file():
        paths = [p for p in ckpt.rglob("*") if p.is_file()]
        if not any(p.suffix == ".safetensors" for p in paths):
            raise CheckpointError(f"{where} has no model weights (no {ckpt}/model/*.safetensors) and no {MANIFEST}")
        if not without_manifest:
            raise CheckpointError(
                f"{where}: {manifest_path} is missing, so nothing says its files are the ones written (a byte "
                f"changed in the weights would be trained on and pushed); restore it, or pass "
                f"--load-without-manifest to load the checkpoint on its format checks alone"
            )
        manifest = {}
    else:
        problem = format_problem(manifest_path)
        if problem:
            raise CheckpointError(f"{where}: {manifest_path}: {problem}")
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        paths = []
        for name, entry in manifest.get("files", {}).items():
            path = ckpt / name
            if not path.is_file():
                raise CheckpointError(f"{where}: {path} is listed in {MANIFEST} but missing")
            if path.stat().st_size != entry["size"]:
                raise CheckpointError(
                    f"{where}: {path} has {path.stat().st_size} bytes, {MANIFEST} says "
                    f"{entry['size']} (truncated or overwritten)"
                )
            paths.append(path)
    for path in paths:
        problem = format_problem(path)
        if problem:
            raise CheckpointError(f"{where}: {path}: {problem}")
    if hashes and manifest:
        for name, entry in manifest["files"].items():
            if sha256_of(ckpt / name) != entry["sha256"]:
                raise CheckpointError(f"{where}: {ckpt / name}: sha256 differs from {MANIFEST} (corrupted)")
    for path in paths:
        problem = loader_problem(path)
        if problem:
            raise CheckpointError(f"{where}: {path}: {problem}")
    return manifest


def check_same_model(root: str | Path, rollout_id: int, manifest: dict[str, Any], hf_checkpoint: str | None) -> None:
    """Refuse a checkpoint whose model is another architecture than `--hf-checkpoint`'s (the engines
    serve --hf-checkpoint's shapes: the first push would fail far from the cause)."""
    if not hf_checkpoint:
        return
    model_dir = checkpoint_dir(root, rollout_id) / "model"
    saved, wanted = model_identity(model_dir), model_identity(hf_checkpoint)
    if saved and wanted and saved != wanted:
        base = manifest.get("base_model")
        raise CheckpointError(
            f"--load {root}: the checkpoint of rollout {rollout_id} is another model than --hf-checkpoint: "
            f"{model_dir} ({describe_identity(saved)}"
            + (f"; trained from {base}" if base else "")
            + f") vs --hf-checkpoint {hf_checkpoint} "
            f"({describe_identity(wanted)}); pass the --hf-checkpoint it was trained from or another --load"
        )
