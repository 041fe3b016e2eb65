"""Debug rollout files in slime's format: `torch.save({"rollout_id", "samples": [dict]})`.

Only builtins are written, so a file loads with `torch.load(weights_only=True)`: replaying a
dump never unpickles arbitrary objects. Files written by slime load too (tensors are allowed by
`weights_only`); sample fields we do not know are kept, with one warning per file.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from slime.observability.rollout_data_utils import to_builtins as _plain
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


class DebugDataError(ValueError):
    pass


def path_for(template: str, rollout_id: int) -> Path:
    return Path(template.format(rollout_id=rollout_id))


def save_debug_rollout(template: str, rollout_id: int, samples: list[Sample]) -> Path:
    path = path_for(template, rollout_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    import torch  # here, not at the top: the rollout manager imports this module while it starts

    torch.save({"rollout_id": rollout_id, "samples": [_plain(s.to_dict()) for s in samples]}, tmp)
    tmp.replace(path)
    return path


def load_debug_rollout(template: str, rollout_id: int) -> list[Sample]:
    path = path_for(template, rollout_id)
    if not path.is_file():
        raise DebugDataError(f"--load-debug-rollout-data: file not found: {path}")
    import torch

    try:
        data = torch.load(path, weights_only=True)
    except Exception as e:  # noqa: BLE001 - corrupt, truncated or unsafe pickles all land here
        raise DebugDataError(
            f"--load-debug-rollout-data: {path} is not a valid slime debug rollout file "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
        raise DebugDataError(f"--load-debug-rollout-data: {path} has no 'samples' list")
    samples, unknown = [], set()
    for i, d in enumerate(data["samples"]):
        try:
            sample = Sample.from_dict(d, warn_unknown=False)
        except (TypeError, ValueError) as e:
            raise DebugDataError(f"--load-debug-rollout-data: {path}: bad sample #{i}: {e}") from None
        unknown.update(sample.extra_fields)
        samples.append(sample)
    if unknown:  # a newer slime wrote fields we do not know: kept (and written back), said once per file
        logger.warning(
            "--load-debug-rollout-data: %s: keeping unknown sample field(s) %s in sample.extra_fields",
            path,
            sorted(unknown),
        )
    return samples


def save_debug_train_data(template: str, rollout_id: int, batch: dict[str, Any]) -> Path:
    path = path_for(template, rollout_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    import torch

    torch.save({"rollout_id": rollout_id, "data": _plain(batch)}, path)
    return path


def to_json(samples: list[Sample]) -> str:
    return json.dumps([_plain(s.to_dict()) for s in samples])
