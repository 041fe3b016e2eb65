"""Tokenizer / processor loading and the image helpers slime plugins import from here.

Checkpoints are local directories only: nothing is fetched from the HF hub (a name that is not a
directory is refused with a message naming it). transformers and PIL are imported on first use.
"""

from __future__ import annotations

import base64
import io
import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Vision patch size when the processor does not say (Qwen2.5-VL uses 14, Qwen3-VL 16).
DEFAULT_PATCH_SIZE = 14


def _local_dir(name_or_path: str | Path, what: str) -> str:
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"{what}: {str(name_or_path)!r} is not a local model directory "
                                f"(--hf-checkpoint must be a path; nothing is downloaded from the hub)")
    return str(path)


def load_tokenizer(name_or_path: str | Path, **kwargs: Any):
    """`AutoTokenizer.from_pretrained` on a local directory (kwargs passed through, e.g. trust_remote_code).
    A class named by `tokenizer_config.json` (its fast variant first, as AutoTokenizer picks) loads
    directly: the same tokenizer, without the auto classes' imports of configs and torch (~1.5 s of CPU
    in the rollout manager, which needs neither)."""
    path = _local_dir(name_or_path, "load_tokenizer")
    kwargs.setdefault("local_files_only", True)
    named = _named_tokenizer_class(Path(path))
    if named and not kwargs.get("trust_remote_code") and kwargs.get("use_fast", True):
        import transformers

        for candidate in dict.fromkeys((named if named.endswith("Fast") else f"{named}Fast", named)):
            cls = getattr(transformers, candidate, None)
            if cls is not None and hasattr(cls, "from_pretrained"):
                return cls.from_pretrained(path, **{k: v for k, v in kwargs.items() if k != "use_fast"})
    from transformers import AutoTokenizer

    if "config" not in kwargs and named:
        from transformers import PretrainedConfig

        # the class is named: AutoConfig would only import the model's code to find it again (~2 s of CPU)
        kwargs["config"] = PretrainedConfig()
    return AutoTokenizer.from_pretrained(path, **kwargs)


def _named_tokenizer_class(path: Path) -> str | None:
    """`tokenizer_class` of `tokenizer_config.json`; None when absent or when it is remote code (`auto_map`)."""
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = config.get("tokenizer_class") if isinstance(config, dict) else None
    return name if isinstance(name, str) and name and not config.get("auto_map") else None


def load_processor(name_or_path: str | Path, **kwargs: Any):
    """The multimodal processor of a local checkpoint, or None for a text-only model (as slime returns)."""
    from transformers import AutoProcessor, PreTrainedTokenizerBase, ProcessorMixin

    path = _local_dir(name_or_path, "load_processor")
    if not _has_processor_files(Path(path)):
        return None  # AutoProcessor would only fall back to the tokenizer, after seconds of imports and loading
    kwargs.setdefault("local_files_only", True)
    try:
        proc = AutoProcessor.from_pretrained(path, **kwargs)
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.info("no processor in %s (%s: %s); text-only model", path, type(e).__name__, e)
        return None
    if isinstance(proc, PreTrainedTokenizerBase) or not isinstance(proc, ProcessorMixin):
        return None  # AutoProcessor falls back to the tokenizer for text-only models
    return proc


# what AutoProcessor reads before falling back to the tokenizer: a checkpoint with none is text-only
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json")


def _has_processor_files(path: Path) -> bool:
    if any((path / name).is_file() for name in PROCESSOR_FILES):
        return True
    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return True  # unreadable: let AutoProcessor decide
    return isinstance(config, dict) and "processor_class" in config


def build_processor_kwargs(multimodal_inputs: dict | None = None) -> dict:
    """Processor call kwargs: text as plain id lists, modality outputs as torch tensors."""
    result = dict(multimodal_inputs or {})
    result["text_kwargs"] = {**result.get("text_kwargs", {}), "return_tensors": None,
                             "return_mm_token_type_ids": False}
    for key in ("audio_kwargs", "images_kwargs", "videos_kwargs"):
        result[key] = {**result.get(key, {}), "return_tensors": "pt"}
    return result


def _open_image(data: Any):
    from PIL import Image

    if isinstance(data, Image.Image):
        return data
    if not isinstance(data, str):
        raise TypeError(f"image must be a PIL image, a base64 string or a file path, got {type(data).__name__}")
    if data.startswith("data:"):
        return Image.open(io.BytesIO(base64.b64decode(data.split(",", 1)[1])))
    if Path(data).is_file():
        return Image.open(data)
    return Image.open(io.BytesIO(base64.b64decode(data)))


def _extract_images_from_messages(messages: list[dict]) -> list:
    """PIL images of every `{"type": "image", "image": ...}` content item, in order."""
    images = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for item in content:
            if isinstance(item, dict) and item.get("type") == "image" and item.get("image") is not None:
                images.append(_open_image(item["image"]))
    return images


def process_vision_info(prompt: list[dict], processor: Any) -> dict:
    """{"images", "videos"} of a message list: qwen_vl_utils when installed, generic extraction otherwise."""
    try:
        from qwen_vl_utils import process_vision_info as qwen_process_vision_info
    except ImportError:
        qwen_process_vision_info = None
    if qwen_process_vision_info is not None:
        patch = getattr(getattr(processor, "image_processor", None), "patch_size", None) or DEFAULT_PATCH_SIZE
        try:
            images, videos = qwen_process_vision_info(prompt, image_patch_size=patch)
            return {"images": images, "videos": videos}
        except Exception as e:  # noqa: BLE001 - non-Qwen message layouts: fall back as slime does
            logger.debug("qwen_vl_utils could not read the messages (%s); generic image extraction", e)
    return {"images": _extract_images_from_messages(prompt) or None, "videos": None}


def encode_image_for_rollout_engine(image: Any) -> str:
    """An image as the `data:image/png;base64,...` string SGLang's `image_data` accepts (RGB PNG)."""
    image = _open_image(image)
    if image.mode != "RGB":
        image = image.convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
