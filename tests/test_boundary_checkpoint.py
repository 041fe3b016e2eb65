"""Checkpoints for `--load`, hypothesis-corrupted: the tracker, the manifest, trainer_state.json, the
safetensors header, the optimizer archive, any file truncated or with a byte flipped. The check
preflight runs before Ray starts either refuses with a `CheckpointError` naming `--load` and the
file, or accepts a checkpoint the trainer then loads (every tensor, the step, the optimizer)."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

from slime.train.checkpoint import (
    CHECKPOINT_TRACKER,
    MANIFEST,
    CheckpointError,
    CheckpointWriter,
    checkpoint_dir,
    latest_checkpoint,
    verify_checkpoint,
)

FILES = ["model/model.safetensors", "model/config.json", "optimizer.pt", "trainer_state.json"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("saved") / "ckpt"
    root.mkdir()
    writer = CheckpointWriter(root, 1)
    (writer.staging / "model").mkdir()
    save_file(
        {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3)},
        str(writer.staging / "model/model.safetensors"),
    )
    (writer.staging / "model/config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 3}))
    torch.save(
        {"optimizer": {"state": {}, "param_groups": []}, "scheduler": {"last_epoch": 1}},
        writer.staging / "optimizer.pt",
    )
    (writer.staging / "trainer_state.json").write_text(json.dumps({"rollout_id": 1, "global_step": 3}))
    writer.commit(None, {"global_step": 3, "data_state": False})
    return root


def fresh_copy(saved: Path, tmp_path_factory) -> Path:
    return Path(shutil.copytree(saved, tmp_path_factory.mktemp("ckpt") / "ckpt"))


def reseal(root: Path, name: str) -> None:
    """Rewrite the manifest's entry for `name` as a writer that wrote this content would have."""
    ckpt = checkpoint_dir(root, 1)
    manifest = json.loads((ckpt / MANIFEST).read_text())
    data = (ckpt / name).read_bytes()
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / MANIFEST).write_text(json.dumps(manifest))


def loads_as_the_trainer_does(root: Path) -> None:
    """What the trainer reads after Ray started: every tensor, the step, the optimizer's state."""
    ckpt = checkpoint_dir(root, 1)
    with safe_open(str(ckpt / "model/model.safetensors"), framework="pt") as f:
        for key in f.keys():
            f.get_tensor(key)
    int(json.loads((ckpt / "trainer_state.json").read_text()).get("global_step", 0))
    torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True)


def refused_naming_the_file_or_loadable(root: Path) -> str:
    try:
        rollout_id = latest_checkpoint(root)
        if rollout_id is not None:
            verify_checkpoint(root, rollout_id)
    except CheckpointError as e:
        message = str(e)
        assert f"--load {root}" in message, message
        assert str(root) + "/" in message.replace(f"--load {root}", ""), message  # a file under it
        return "refused"
    if rollout_id == 1:
        loads_as_the_trainer_does(root)
    return "accepted"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**20) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=8))
@example(text="²")  # a digit to str.isdigit, not to int()
@example(text="1")
def test_a_corrupted_tracker_is_refused_naming_it(saved, tmp_path_factory, text):
    root = fresh_copy(saved, tmp_path_factory)
    (root / CHECKPOINT_TRACKER).write_text(text, encoding="utf-8", errors="surrogatepass")
    outcome = refused_naming_the_file_or_loadable(root)
    if not (text.strip().isascii() and text.strip().isdigit()):
        assert outcome == "refused"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from([MANIFEST, "trainer_state.json", "model/config.json"]),
    value=json_values,
    resealed=st.booleans(),
)
@example(name="trainer_state.json", value=[], resealed=True)
@example(name="trainer_state.json", value={"global_step": "x"}, resealed=True)
@example(name=MANIFEST, value={"files": {"x": 3}}, resealed=False)
@example(name=MANIFEST, value={"files": {"../../etc/passwd": {"size": 1, "sha256": ""}}}, resealed=False)
def test_json_files_of_the_wrong_shape_are_refused_naming_them(saved, tmp_path_factory, name, value, resealed):
    root = fresh_copy(saved, tmp_path_factory)
    (checkpoint_dir(root, 1) / name).write_text(json.dumps(value))
    if resealed and name != MANIFEST:
        reseal(root, name)  # (as a buggy writer would have listed it)
    assert refused_naming_the_file_or_loadable(root) == "refused" or isinstance(value, dict)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=json_values)
@example(header={"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": "0-24"}})
@example(header=[1, 2])
def test_a_safetensors_header_of_the_wrong_shape_is_refused(saved, tmp_path_factory, header):
    root = fresh_copy(saved, tmp_path_factory)
    path = checkpoint_dir(root, 1) / "model/model.safetensors"
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data[8 + n :])
    reseal(root, "model/model.safetensors")
    refused_naming_the_file_or_loadable(root)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(FILES + [MANIFEST]), where=st.floats(0, 1), flip=st.booleans(), resealed=st.booleans())
@example(name="optimizer.pt", where=0.5, flip=True, resealed=True)
@example(name="optimizer.pt", where=0.6231, flip=True, resealed=True)  # the zip's flags: torch.load refused it
@example(name="model/model.safetensors", where=0.9, flip=False, resealed=True)
def test_a_truncated_or_flipped_file_is_refused_naming_it(saved, tmp_path_factory, name, where, flip, resealed):
    root = fresh_copy(saved, tmp_path_factory)
    path = checkpoint_dir(root, 1) / name
    data = bytearray(path.read_bytes())
    at = min(int(where * len(data)), len(data) - 1)
    if flip:
        data[at] ^= 0xFF
    else:
        del data[at:]
    path.write_bytes(bytes(data))
    if resealed and name != MANIFEST:
        reseal(root, name)
    outcome = refused_naming_the_file_or_loadable(root)
    if not resealed:
        assert outcome == "refused"  # the manifest's size or sha256


def test_a_zip_that_is_not_a_torch_archive_is_refused(saved, tmp_path):
    import zipfile

    root = Path(shutil.copytree(saved, tmp_path / "ckpt"))
    path = checkpoint_dir(root, 1) / "optimizer.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("notes.txt", "hello")
    reseal(root, "optimizer.pt")
    with pytest.raises(CheckpointError) as e:
        verify_checkpoint(root, 1)
    assert str(e.value) == (
        f"--load {root}: the checkpoint of rollout 1: {path}: a zip archive, but not torch's (no data.pkl)"
    )


def test_slime_train_refuses_a_bad_trainer_state_before_anything_starts(saved, tmp_path, tiny_model_dir, capsys):
    """The command's own preflight, not only the check: rc 1, nothing started, `--load` and the file named."""
    from slime.cli.command import run_cli
    from slime.cli.train import parse_train_args

    root = Path(shutil.copytree(saved, tmp_path / "ckpt"))
    state = checkpoint_dir(root, 1) / "trainer_state.json"
    state.write_text(json.dumps({"rollout_id": 1, "global_step": "three"}))
    reseal(root, "trainer_state.json")
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n")
    started = []
    argv = [
        "--rollout-backend",
        "hf",
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--prompt-data",
        str(data),
        "--input-key",
        "messages",
        "--rollout-batch-size",
        "1",
        "--n-samples-per-prompt",
        "2",
        "--global-batch-size",
        "2",
        "--num-rollout",
        "3",
        "--load",
        str(root),
    ]
    rc = run_cli("slime-train", argv, parse_train_args, started.append)
    assert rc == 1 and started == []
    assert capsys.readouterr().err == (
        f"slime-train: error: --load {root}: the checkpoint of rollout 1: {state}: "
        "'global_step' must be a non-negative integer, got 'three'\n"
    )


def test_no_byte_flip_of_the_optimizer_passes_preflight_and_fails_the_trainer(saved, tmp_path):
    """Every byte of optimizer.pt's zip structure (local headers, central directory: outside every CRC)
    flipped in turn, the manifest resealed (as a writer would have, or an attacker): preflight refuses
    it naming the file, or the trainer's torch.load reads it. 115 of its 1,337 bytes (zip flags,
    attributes, names) passed preflight and then failed torch.load; three of those (a file attribute)
    failed it only some of the time."""
    import zipfile

    root = Path(shutil.copytree(saved, tmp_path / "ckpt"))
    path = checkpoint_dir(root, 1) / "optimizer.pt"
    original = path.read_bytes()
    with zipfile.ZipFile(path) as z:
        structure = set(range(z.start_dir, len(original)))
        for info in z.infolist():
            structure |= set(range(info.header_offset, info.header_offset + 30 + len(info.filename)))
    outcomes = Counter()
    for at in sorted(structure):
        data = bytearray(original)
        data[at] ^= 0xFF
        path.write_bytes(bytes(data))
        reseal(root, "optimizer.pt")
        outcomes[refused_naming_the_file_or_loadable(root)] += 1
    assert outcomes["refused"] > len(structure) // 2, outcomes
