"""Checkpoints that cannot be half-written or half-resumed (issue 20, items 11 and 13).

The checkpoint is written by the real `TrainWorker.save_model` (tiny model, a one-rank gloo group in
this process, no Ray), then damaged the ways a crash, a full disk or a user does; `slime-train`'s
command (`run_cli` with its own argument parser) must refuse before its body (Ray) starts, naming
`--load` and the file, or say exactly where it resumes.
"""

from __future__ import annotations

import json
import resource
import shutil
import signal
from pathlib import Path

import pytest

from slime.cli.command import run_cli
from slime.cli.train import parse_train_args
from slime.train.checkpoint import CHECKPOINT_TRACKER, MANIFEST, checkpoint_dir, format_problem
from slime.train.loop import save_due
from slime.train.save_dir import SaveDirError, SaveDirLock, check_save_dir

ROWS = 8


def _argv(model: Path, data: Path, *extra: str) -> list[str]:
    return [
        "--rollout-backend",
        "hf",
        "--hf-checkpoint",
        str(model),
        "--prompt-data",
        str(data),
        "--input-key",
        "messages",
        "--apply-chat-template",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--global-batch-size",
        "4",
        "--num-rollout",
        "5",
        *extra,
    ]


def _state(offset: int) -> str:
    return json.dumps(
        {
            "epoch_id": 0,
            "offset": offset,
            "group_counter": offset,
            "sample_counter": 2 * offset,
            "num_prompts": ROWS,
            "buffer": [],
        }
    )


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text(
        "".join(json.dumps({"messages": [{"role": "user", "content": f"Count to {i}."}]}) + "\n" for i in range(ROWS))
    )
    return path


def _worker(args):
    from slime.train.flags import WorkerConfig
    from slime.train.worker import TrainWorker
    from slime.utils.misc import find_free_port

    worker = TrainWorker(WorkerConfig.from_args(args), args, 1, 0)
    worker.init("127.0.0.1", find_free_port("127.0.0.1"))
    return worker


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_model_dir, data_file) -> Path:
    """`--save DIR` after rollout 1, written by the trainer's own save path (data state saved first,
    as the loop does)."""
    root = tmp_path_factory.mktemp("saved") / "ckpt"
    root.mkdir()
    worker = _worker(parse_train_args(_argv(tiny_model_dir, data_file, "--save", str(root))))
    try:
        (root / "rollout_state_1.json").write_text(_state(4))
        (root / "latest_rollout_id.txt").write_text("1")
        assert worker.save_model(1) == str(checkpoint_dir(root, 1))
    finally:
        worker.shutdown()
    return root


@pytest.fixture
def ckpt(saved, tmp_path) -> Path:
    """A private copy of the saved checkpoint, to damage."""
    return Path(shutil.copytree(saved, tmp_path / "ckpt"))


def _run(argv: list[str], capsys) -> tuple[int, list, str, str]:
    seen = []
    rc = run_cli("slime-train", argv, parse_train_args, lambda a: seen.append(a.start_rollout_id))
    out = capsys.readouterr()
    return rc, seen, out.out, out.err


def test_the_manifest_is_written_last_and_lists_every_file(saved):
    ckpt = checkpoint_dir(saved, 1)
    manifest = json.loads((ckpt / MANIFEST).read_text())
    on_disk = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file() and p.name != MANIFEST)
    assert sorted(manifest["files"]) == on_disk
    assert {
        "model/model.safetensors",
        "model/config.json",
        "model/tokenizer.json",
        "optimizer.pt",
        "trainer_state.json",
        "rollout_state_1.json",
    } <= set(on_disk)
    assert all(manifest["files"][n]["size"] == (ckpt / n).stat().st_size for n in on_disk)
    assert manifest["rollout_id"] == 1 and manifest["data_state"] is True
    assert (ckpt / "rollout_state_1.json").read_text() == _state(4)  # the data state is part of the unit
    assert (saved / CHECKPOINT_TRACKER).read_text() == "1"
    assert sorted(p.name for p in saved.iterdir()) == sorted(
        [CHECKPOINT_TRACKER, "iter_0000001", "latest_rollout_id.txt", "rollout_state_1.json"]
    )  # no staging left


@pytest.mark.parametrize("name", ["model/model.safetensors", "optimizer.pt"])
@pytest.mark.parametrize("with_manifest", [True, False])
def test_a_truncated_file_is_refused_before_anything_starts(
    ckpt, tiny_model_dir, data_file, capsys, name, with_manifest
):
    path = checkpoint_dir(ckpt, 1) / name
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    extra = []
    if not with_manifest:  # a checkpoint from before manifests, accepted by name: the format check catches it
        (checkpoint_dir(ckpt, 1) / MANIFEST).unlink()
        extra = ["--load-without-manifest"]
    rc, seen, _, err = _run(_argv(tiny_model_dir, data_file, "--load", str(ckpt), *extra), capsys)
    assert rc == 1 and seen == []
    expected = f"has {size - 100} bytes, manifest.json says {size}" if with_manifest else "truncated"
    assert err.startswith(f"slime-train: error: --load {ckpt}: the checkpoint of rollout 1: {path}")
    assert expected in err


def test_a_flipped_byte_is_refused_by_its_hash(ckpt, tiny_model_dir, data_file, capsys):
    path = checkpoint_dir(ckpt, 1) / "model" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    rc, seen, _, err = _run(_argv(tiny_model_dir, data_file, "--load", str(ckpt)), capsys)
    assert rc == 1 and seen == []
    assert err == (
        f"slime-train: error: --load {ckpt}: the checkpoint of rollout 1: {path}: sha256 differs from "
        "manifest.json (corrupted)\n"
    )


def test_a_checkpoint_without_its_manifest_is_refused_unless_the_risk_is_named(ckpt, tiny_model_dir, data_file, capsys):
    """The manifest deleted and 16 bytes of the weights flipped (their format intact): refused, naming
    the flag that takes the risk; with it, the run starts (as before, when this trained on the
    corrupted weights: entropy 11.9 -> 0.000)."""
    path = checkpoint_dir(ckpt, 1) / "model" / "model.safetensors"
    data = bytearray(path.read_bytes())
    for i in range(len(data) - 16, len(data)):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    (checkpoint_dir(ckpt, 1) / MANIFEST).unlink()
    rc, seen, _, err = _run(_argv(tiny_model_dir, data_file, "--load", str(ckpt)), capsys)
    assert rc == 1 and seen == []
    assert err == (
        f"slime-train: error: --load {ckpt}: the checkpoint of rollout 1: {checkpoint_dir(ckpt, 1) / MANIFEST} "
        "is missing, so nothing says its files are the ones written (a byte changed in the weights would "
        "be trained on and pushed); restore it, or pass --load-without-manifest to load the checkpoint "
        "on its format checks alone\n"
    )
    rc, seen, _, _ = _run(_argv(tiny_model_dir, data_file, "--load", str(ckpt), "--load-without-manifest"), capsys)
    assert rc == 0 and seen == [2]


def test_the_trainer_loads_the_checkpoint_preflight_verified(ckpt, tiny_model_dir, data_file, capsys):
    """Another run moves the tracker to a newer (here: corrupted) checkpoint after preflight verified
    rollout 1: the trainer still loads rollout 1 (it loaded whatever the tracker named by then)."""
    from slime.train.checkpoint import latest_checkpoint

    args = []
    rc = run_cli("slime-train", _argv(tiny_model_dir, data_file, "--load", str(ckpt)), parse_train_args, args.append)
    assert rc == 0
    newer = checkpoint_dir(ckpt, 7)
    shutil.copytree(checkpoint_dir(ckpt, 1), newer)
    (newer / "optimizer.pt").write_bytes(b"corrupted")
    (ckpt / CHECKPOINT_TRACKER).write_text("7")
    [resolved] = args
    assert resolved.start_rollout_id == 2 and latest_checkpoint(resolved.load, resolved.ckpt_step) == 1
    from slime.train.flags import WorkerConfig
    from slime.train.worker import TrainWorker
    from slime.utils.misc import find_free_port

    worker = TrainWorker(WorkerConfig.from_args(resolved), resolved, 1, 0)
    try:
        assert worker.init("127.0.0.1", find_free_port("127.0.0.1"))["loaded_rollout_id"] == 1
    finally:
        worker.shutdown()


def test_resume_says_what_happens_when_the_data_state_is_newer_than_the_model(ckpt, tiny_model_dir, data_file, capsys):
    (ckpt / "rollout_state_3.json").write_text(_state(8))
    (ckpt / "latest_rollout_id.txt").write_text("3")
    rc, seen, out, _ = _run(_argv(tiny_model_dir, data_file, "--load", str(ckpt)), capsys)
    assert rc == 0 and seen == [2]
    assert out == (
        f"--load {ckpt}: resuming from the checkpoint of rollout 1 (model, optimizer, data state), at "
        "rollout 2; the data state saved after rollout 3 is newer than this checkpoint and is not used "
        "(rollouts 2..3 run again)\n"
    )


def test_the_data_state_of_the_checkpoint_is_the_one_restored(ckpt, tiny_model_dir, data_file):
    """The manager's `load` reads the copy inside the checkpoint, not the newer one beside it."""
    from slime.rollout.data_source import DataSource
    from slime.train.checkpoint import data_state_dir
    from slime.utils.processing_utils import load_tokenizer

    (ckpt / "rollout_state_1.json").write_text(_state(7))  # overwritten by a later run: not the checkpoint's
    args = parse_train_args(_argv(tiny_model_dir, data_file, "--load", str(ckpt)))
    source = DataSource.from_args(args, load_tokenizer(tiny_model_dir))
    assert source.load(data_state_dir(ckpt, 1), 1) == 1
    assert (source.offset, source.sample_counter) == (4, 8)


def test_a_data_state_without_a_model_checkpoint_is_refused(tmp_path, tiny_model_dir, data_file, capsys):
    """slime-train's `--load` never continues the data on the base model (it used to, silently)."""
    (tmp_path / "rollout_state_2.json").write_text(_state(6))
    (tmp_path / "latest_rollout_id.txt").write_text("2")
    rc, seen, _, err = _run(_argv(tiny_model_dir, data_file, "--load", str(tmp_path)), capsys)
    assert rc == 1 and seen == []
    assert err.startswith(
        f"slime-train: error: --load {tmp_path}: holds the data source's state after rollout 2 "
        f"but no model checkpoint ({CHECKPOINT_TRACKER})"
    )


def test_an_explicit_start_that_disagrees_with_the_checkpoint_is_refused(ckpt, tiny_model_dir, data_file, capsys):
    rc, seen, _, err = _run(_argv(tiny_model_dir, data_file, "--load", str(ckpt), "--start-rollout-id", "4"), capsys)
    assert rc == 1 and seen == []
    assert err.startswith(
        f"slime-train: error: --start-rollout-id 4 with --load {ckpt}: the trainer resumes from "
        "the checkpoint of rollout 1, at rollout 2"
    )


def test_a_checkpoint_of_another_model_is_refused_with_both_names(ckpt, data_file, tmp_path, capsys):
    from slime.testing.tiny_model import build_tiny_model

    other = build_tiny_model(tmp_path / "other", hidden_size=32)
    capsys.readouterr()  # its progress bars
    rc, seen, _, err = _run(_argv(other, data_file, "--load", str(ckpt)), capsys)
    assert rc == 1 and seen == []
    assert err.startswith(
        f"slime-train: error: --load {ckpt}: the checkpoint of rollout 1 is another model than "
        f"--hf-checkpoint: {checkpoint_dir(ckpt, 1) / 'model'} ("
    )
    assert "hidden_size=64" in err and f"vs --hf-checkpoint {other} (" in err and "hidden_size=32" in err


def test_a_second_run_on_the_same_save_dir_is_refused(tmp_path, tiny_model_dir, data_file, capsys):
    argv = _argv(tiny_model_dir, data_file, "--save", str(tmp_path / "out"))
    inner = []

    def body(args):
        inner.append(_run(argv, capsys))

    assert run_cli("slime-train", argv, parse_train_args, body) == 0
    [(rc, seen, _, err)] = inner
    assert rc == 1 and seen == []
    assert err == (
        f"slime-train: error: --save {tmp_path / 'out'}: another run is writing checkpoints there (the "
        "directory is locked); give each run its own --save directory\n"
    )
    with SaveDirLock(tmp_path / "out"):  # released when the first run ended
        pass


def test_an_unwritable_save_dir_is_refused_before_anything_starts(tmp_path, tiny_model_dir, data_file, capsys):
    (tmp_path / "file").write_text("")
    rc, seen, _, err = _run(_argv(tiny_model_dir, data_file, "--save", str(tmp_path / "file" / "ckpt")), capsys)
    assert rc == 1 and seen == []
    assert err == f"slime-train: error: --save {tmp_path / 'file' / 'ckpt'}: not writable (Not a directory)\n"


def test_a_save_dir_without_room_for_a_checkpoint_is_refused(tmp_path):
    check_save_dir(tmp_path, 1 << 20)  # 1 MB fits
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(
        SaveDirError,
        match=rf"^--save {tmp_path}: \d+ MB free, a checkpoint needs about "
        rf"{free * 1.1 / (1 << 20):.0f} MB \(float32 weights and AdamW",
    ):
        check_save_dir(tmp_path, free)


def test_a_save_that_fails_leaves_the_previous_checkpoint_current(ckpt, tiny_model_dir, data_file):
    """The disk fills in the middle of writing the weights (a file-size limit makes the write fail for
    real): the error names --save and the rollout, nothing half-written is left, rollout 1 stays."""
    worker = _worker(parse_train_args(_argv(tiny_model_dir, data_file, "--save", str(ckpt))))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    before = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, hard))
        with pytest.raises(
            Exception,
            match=rf"^--save {ckpt}: the checkpoint of rollout 2 could not be written "
            r"\(.*\); the previous checkpoint stays current$",
        ):
            worker.save_model(2)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, before)
        worker.shutdown()
    assert (ckpt / CHECKPOINT_TRACKER).read_text() == "1"
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("iter_")) == ["iter_0000001"]


def test_saving_an_id_again_replaces_it_whole(ckpt, tiny_model_dir, data_file):
    worker = _worker(parse_train_args(_argv(tiny_model_dir, data_file, "--save", str(ckpt))))
    try:
        worker.global_step = 9
        worker.save_model(1)
    finally:
        worker.shutdown()
    manifest = json.loads((checkpoint_dir(ckpt, 1) / MANIFEST).read_text())
    assert manifest["global_step"] == 9
    assert json.loads((checkpoint_dir(ckpt, 1) / "trainer_state.json").read_text())["global_step"] == 9
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("iter_")) == ["iter_0000001"]
    assert all(format_problem(p) is None for p in checkpoint_dir(ckpt, 1).rglob("*") if p.is_file())


@pytest.mark.parametrize("interval,expected", [(None, [4]), (2, [1, 3, 4])])
def test_save_without_interval_saves_the_model_after_the_last_rollout(interval, expected):
    from types import SimpleNamespace

    args = SimpleNamespace(save="/x", save_interval=interval, num_rollout=5)
    assert [r for r in range(5) if save_due(args, r, None)] == expected
    assert not any(save_due(SimpleNamespace(save=None, save_interval=2, num_rollout=5), r, None) for r in range(5))


def test_a_crash_between_the_two_renames_names_the_copy_to_restore(ckpt, tiny_model_dir, data_file, capsys):
    """Saving an id again moves the old copy aside, then the new one in: a crash in between leaves the
    tracker naming a missing directory, and the old copy beside it."""
    final = checkpoint_dir(ckpt, 1)
    aside = final.with_name(f"{final.name}.replaced-4242")
    final.replace(aside)
    rc, seen, _, err = _run(_argv(tiny_model_dir, data_file, "--load", str(ckpt)), capsys)
    assert rc == 1 and seen == []
    assert err == (
        f"slime-train: error: --load {ckpt}: the checkpoint of rollout 1 is missing: {final} does not "
        f"exist; a crash while saving it again left the previous copy {aside}: rename it to {final}\n"
    )
    aside.replace(final)
    rc, seen, _, _ = _run(_argv(tiny_model_dir, data_file, "--load", str(ckpt)), capsys)
    assert rc == 0 and seen == [2]
