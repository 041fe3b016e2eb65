"""`load_tokenizer` loads the class `tokenizer_config.json` names directly (no auto-class imports, no
torch): it must give exactly the tokenizer `AutoTokenizer` gives, and fall back to it otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slime.utils.processing_utils import load_tokenizer

TEXTS = ["Hello, world!", "  two  spaces\nand a newline\t", "naïve café 東京 🙂", "<|im_start|>user\nhi<|im_end|>"]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
]


def _same_as_auto(path: Path) -> None:
    from transformers import AutoTokenizer

    ours, auto = load_tokenizer(path), AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    assert type(ours) is type(auto)
    assert ours.special_tokens_map == auto.special_tokens_map
    assert (ours.eos_token_id, ours.pad_token_id, ours.bos_token_id) == (
        auto.eos_token_id,
        auto.pad_token_id,
        auto.bos_token_id,
    )
    assert len(ours) == len(auto)
    for text in TEXTS:
        assert ours(text, add_special_tokens=False)["input_ids"] == auto(text, add_special_tokens=False)["input_ids"]
        assert ours(text)["input_ids"] == auto(text)["input_ids"]
    if auto.chat_template:
        assert ours.apply_chat_template(MESSAGES, tokenize=False) == auto.apply_chat_template(MESSAGES, tokenize=False)


def test_tiny_model_tokenizer_equals_autotokenizer(tiny_model_dir):
    _same_as_auto(Path(tiny_model_dir))


def test_default_model_tokenizer_equals_autotokenizer():
    from slime.engine.default_model import ensure_default_model

    _same_as_auto(Path(ensure_default_model()))


def test_loading_a_named_tokenizer_does_not_import_torch(tiny_model_dir):
    code = (
        "import sys; from slime.utils.processing_utils import load_tokenizer; "
        f"t = load_tokenizer({str(tiny_model_dir)!r}); print(type(t).__name__, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "False"


@pytest.mark.parametrize("change", [{"tokenizer_class": None}, {"auto_map": {"AutoTokenizer": ["x.Tok", None]}}])
def test_unnamed_or_remote_code_class_goes_through_autotokenizer(tiny_model_dir, tmp_path, change):
    import shutil

    copy = tmp_path / "model"
    shutil.copytree(tiny_model_dir, copy)
    config_path = copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    for key, value in change.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    config_path.write_text(json.dumps(config))
    from slime.utils import processing_utils

    assert processing_utils._named_tokenizer_class(copy) is None  # noqa: SLF001 - the decision under test
    if "auto_map" not in change:  # a remote-code class would need trust_remote_code to load at all
        _same_as_auto(copy)


def test_a_text_only_checkpoint_has_no_processor_without_asking_autoprocessor(tiny_model_dir, tmp_path, monkeypatch):
    """slime's `GenerateState.processor` loads one per process: for a checkpoint without processor files
    AutoProcessor would only fall back to the tokenizer after seconds of imports (41 s on a loaded box),
    so it is not asked; one with a processor file still is."""
    import shutil

    import transformers

    from slime.utils.processing_utils import load_processor

    asked = []

    def from_pretrained(path, **kw):
        asked.append(Path(path).name)
        raise OSError("no processor here")

    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", from_pretrained)
    assert load_processor(tiny_model_dir) is None and asked == []
    vision = shutil.copytree(tiny_model_dir, tmp_path / "vision")
    (vision / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "Qwen2VLImageProcessor"}))
    assert load_processor(vision) is None and asked == ["vision"]
