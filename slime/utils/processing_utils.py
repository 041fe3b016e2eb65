"""Tokenizer / processor loading and the image helpers slime plugins import from here.

Checkpoints are local directories only: nothing is fetched from the HF hub (a name that is not a
directory is refused with a message naming it). transformers and PIL are imported on first use.
"""

from __future__ import annotations

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
        raise FileNotFoundError(
            f"{what}: {str(name_or_path)!r} is not a local model directory "
            f"(--hf-checkpoint must be a path; nothing is downloaded from the hub)"
        )
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
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError) as e:
        proc = image_only_processor(path)
        if proc is None:
            logger.info("no processor in %s (%s: %s); text-only model", path, type(e).__name__, e)
        return proc
    if isinstance(proc, PreTrainedTokenizerBase) or not isinstance(proc, ProcessorMixin):
        return image_only_processor(path)  # AutoProcessor falls back to the tokenizer for text-only models
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


def image_only_processor(path: str | Path) -> Any:
    """A Qwen2-VL / Qwen2.5-VL checkpoint's processor built without its video processor, or None for any
    other checkpoint. transformers' video processors need torchvision, which CPU boxes here do not have (its
    wheels pull a CUDA torch), and the stock processor refuses to exist without one; images need only the
    PIL image processor and the tokenizer."""
    from slime.utils.vision_model import VISION_MODEL_TYPES, model_type

    kind = model_type(path)
    config_file = Path(path) / "preprocessor_config.json"
    if kind not in VISION_MODEL_TYPES or not config_file.is_file():
        return None
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.processing_utils import ProcessorMixin

    if kind == "qwen2_5_vl":
        from transformers import Qwen2_5_VLProcessor as Stock
    else:
        from transformers import Qwen2VLProcessor as Stock

    class ImageOnlyProcessor(Stock):
        """The stock processor's image path; `videos` are refused (no video processor)."""

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

        def __call__(self, images=None, text=None, videos=None, **kwargs):
            if videos is not None:
                raise ValueError(
                    f"{path}: videos need transformers' video processor (torchvision), "
                    "not installed here; only images are processed"
                )
            return super().__call__(images=images, text=text, **kwargs)

    class TensorImageProcessor(Qwen2VLImageProcessorPil):
        """PIL's image path with torchvision's outputs: torch tensors when no `return_tensors` is given, as
        the torchvision backend slime's users run returns them (slime's geo3k_vlm_multi_turn keeps only
        `torch.Tensor` values of the processor's output: numpy arrays would drop the images from training)."""

        def _preprocess(self, images, *args, **kwargs):
            if kwargs.get("return_tensors") is None:
                kwargs["return_tensors"] = "pt"
            return super()._preprocess(images, *args, **kwargs)

    settings = json.loads(config_file.read_text())
    known = {
        "min_pixels",
        "max_pixels",
        "patch_size",
        "temporal_patch_size",
        "merge_size",
        "image_mean",
        "image_std",
        "do_resize",
        "do_rescale",
        "rescale_factor",
        "do_normalize",
        "do_convert_rgb",
        "size",
    }
    image_processor = TensorImageProcessor(**{k: v for k, v in settings.items() if k in known})
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    template = _chat_template(Path(path)) or getattr(tokenizer, "chat_template", None)
    return ImageOnlyProcessor(image_processor=image_processor, tokenizer=tokenizer, chat_template=template)


def _chat_template(path: Path) -> str | None:
    for name in ("chat_template.jinja", "chat_template.json"):
        file = path / name
        if file.is_file():
            text = file.read_text(encoding="utf-8")
            return json.loads(text).get("chat_template") if name.endswith(".json") else text
    return None


def build_processor_kwargs(multimodal_inputs: dict | None = None) -> dict:
    """Processor call kwargs: text as plain id lists, modality outputs as torch tensors."""
    result = dict(multimodal_inputs or {})
    result["text_kwargs"] = {**result.get("text_kwargs", {}), "return_tensors": None, "return_mm_token_type_ids": False}
    for key in ("audio_kwargs", "images_kwargs", "videos_kwargs"):
        result[key] = {**result.get(key, {}), "return_tensors": "pt"}
    return result


def _open_image(data: Any):
    """A PIL image, a data URI, base64 text or a file path as a PIL image (`slime.utils.images`: URLs refused)."""
    from slime.utils.images import open_image

    return open_image(data)


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
    from slime.utils.images import encode_png_data_uri

    return encode_png_data_uri(image)
