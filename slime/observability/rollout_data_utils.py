"""slime's rollout-data helpers at `slime.observability.rollout_data_utils`: the debug rollout file
(`torch.save({"rollout_id", "samples": [dict]})`), the trainer's tensor conversion, and the
routing-replay (R3) check.

Debug files hold builtins only (`to_builtins`), so they load with `torch.load(weights_only=True)`:
replaying a dump never unpickles arbitrary objects. Files slime wrote load too. torch is imported
where it is used: the rollout manager imports this module (through `debug_data`) while it starts.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slime.utils.types import Sample

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

# batch key -> torch dtype name of its per-sample tensors (None: keep the value's own)
TENSOR_DTYPES: dict[str, str | None] = {
    "tokens": "long",
    "loss_masks": "int",
    "rollout_log_probs": "float32",
    "rollout_top_p_token_ids": "int32",
    "rollout_top_p_token_offsets": "int32",
    "teacher_log_probs": "float32",
    "rollout_routed_experts": None,
}


def to_builtins(obj: Any) -> Any:
    """Builtins only (tuples -> lists, enums -> values, arrays -> lists, unknown objects -> str)."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, dict):
        return {str(k): to_builtins(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_builtins(v) for v in obj]
    if hasattr(obj, "value") and isinstance(getattr(obj, "value"), (str, int)):
        return obj.value
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


def cpu_tensor(value: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A detached, contiguous CPU tensor (read-only numpy arrays are copied, torch refuses them)."""
    import torch

    if hasattr(value, "flags") and not value.flags.writeable:
        value = value.copy()
    tensor = torch.as_tensor(value, dtype=dtype) if dtype is not None else torch.as_tensor(value)
    return tensor.detach().cpu().contiguous()


def tensorize_rollout_data_for_training(rollout_data: dict[str, Any]) -> None:
    """In place: per-sample lists become tensors of the trainer's dtypes; multimodal inputs' arrays
    become tensors (other values kept); `rollout_mask_sums` one float32 tensor."""
    import torch

    for key, dtype_name in TENSOR_DTYPES.items():
        if key in rollout_data:
            dtype = getattr(torch, dtype_name) if dtype_name else None
            rollout_data[key] = [cpu_tensor(v, dtype) for v in rollout_data[key]]
    if "multimodal_train_inputs" in rollout_data:
        rollout_data["multimodal_train_inputs"] = [
            None if mm is None else {k: cpu_tensor(v) if hasattr(v, "shape") else v for k, v in mm.items()}
            for mm in rollout_data["multimodal_train_inputs"]
        ]
    if "rollout_mask_sums" in rollout_data:
        rollout_data["rollout_mask_sums"] = cpu_tensor(rollout_data["rollout_mask_sums"], torch.float32)


def _moe_layers(args: Any, num_layers: int) -> list[int]:
    freq = args.moe_layer_freq
    if isinstance(freq, (list, tuple)):
        return [i for i, f in enumerate(freq[:num_layers]) if int(f) != 0]
    return list(range(num_layers))


def validate_rollout_routed_experts_for_replay(routed_experts: list[Any], args: Any) -> None:
    """Refuse routing captures R3 cannot replay: a shape other than `[rows, num_layers, topk]`, no
    rows, or a MoE layer that is all zeros (pipeline stages that did not merge their captures would
    otherwise replay expert 0 everywhere)."""
    import torch

    if not routed_experts:
        raise ValueError("R3 is enabled but no rollout routed-experts tensors were returned.")
    num_layers, topk = int(args.num_layers), int(args.moe_router_topk)
    moe_layers = _moe_layers(args, num_layers)
    for i, experts in enumerate(routed_experts):
        experts = torch.as_tensor(experts)
        if experts.ndim != 3 or tuple(experts.shape[1:]) != (num_layers, topk):
            raise ValueError(
                f"Invalid rollout routed-experts shape for R3: sample={i}, got={tuple(experts.shape)}, "
                f"expected=(*, {num_layers}, {topk})."
            )
        if experts.shape[0] == 0:
            raise ValueError(f"R3 sample {i} has no routed-experts rows.")
        if topk > 1:
            missing = [layer for layer in moe_layers if not torch.count_nonzero(experts[:, layer, :])]
            if missing:
                raise ValueError(
                    f"R3 routed-experts capture is all zero for MoE layers {missing} in sample {i}: "
                    "the pipeline stages did not merge their routing captures; refusing to replay "
                    "expert 0 everywhere."
                )


def save_debug_rollout_data(path_template: str | None, data: Any, *, rollout_id: int, evaluation: bool) -> None:
    """Write one rollout's samples (eval: every dataset's, flattened, to `rollout_eval_<id>`)."""
    if path_template is None:
        return
    path = Path(path_template.format(rollout_id=("eval_" if evaluation else "") + str(rollout_id)))
    import torch

    samples = [s for info in data.values() for s in info["samples"]] if evaluation else list(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"rollout_id": rollout_id, "samples": [to_builtins(s.to_dict()) for s in samples]}, tmp)
    tmp.replace(path)
    logger.info("saved debug rollout data to %s", path)


def load_debug_rollout_data(
    path_template: str, *, rollout_id: int, subsample_ratio: float | None = None
) -> list[Sample]:
    """The samples of a debug rollout file; with `subsample_ratio`, about that share of them, half
    from the start and half from the end (slime's rule)."""
    import torch

    path = path_template.format(rollout_id=rollout_id)
    samples = [Sample.from_dict(d) for d in torch.load(path, weights_only=True)["samples"]]
    if subsample_ratio is not None:
        half = int(len(samples) * subsample_ratio) // 2
        samples = samples[:half] + samples[len(samples) - half :]
    return samples
