"""Rewards (slime's `slime.rollout.rm_hub`): `async_rm(args, sample)` and
`batched_async_rm(args, samples)`.

Which reward a sample gets, first match wins (slime's order):
1. `sample.custom_rm_path` (set per eval dataset): `async fn(args, sample, **kwargs)`;
2. `--custom-rm-path`: same signature; in `batched_async_rm` it is called once with the list;
3. the rule `sample.metadata["rm_type"]`, else `--rm-type`, from `RM_TYPES`; a `boxed_` prefix
   grades only the last `\\boxed{}` of the response with the rule after it.

Return values are each rule's own (slime's): `math`/`deepscaler`/`random` 1 or 0, `dapo` a dict
`{"score": +-1.0, "acc", "pred"}`, `f1`/`gpqa`/`ifbench` floats, `remote_rm` whatever the server's
JSON is. CPU-heavy rules run in a worker thread so the event loop keeps serving generations.
"""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any

from slime.rollout.rm_hub.deepscaler import get_deepscaler_rule_based_reward
from slime.rollout.rm_hub.f1 import f1_score
from slime.rollout.rm_hub.gpqa import compute_gpqa_reward
from slime.rollout.rm_hub.ifbench import MISSING_MESSAGE as _IFBENCH_MISSING
from slime.rollout.rm_hub.ifbench import ifbench_available
from slime.rollout.rm_hub.math_dapo_utils import compute_score as compute_score_dapo
from slime.rollout.rm_hub.math_utils import extract_answer as extract_boxed_answer
from slime.rollout.rm_hub.math_utils import grade_answer_verl, mathd_normalize_answer
from slime.utils.misc import load_function
from slime.utils.types import Sample
from slime.utils.plugin_args import completed

__all__ = [
    "async_rm",
    "batched_async_rm",
    "inline_rule",
    "remote_rm",
    "check_rm_type",
    "RM_TYPES",
    "UnknownRmType",
    "get_deepscaler_rule_based_reward",
    "f1_score",
    "compute_gpqa_reward",
    "compute_score_dapo",
    "extract_boxed_answer",
    "grade_answer_verl",
    "math_reward",
    "gsm8k_reward",
    "exact_reward",
    "f1_reward",
]


class UnknownRmType(ValueError, NotImplementedError):
    """`--rm-type` (or metadata["rm_type"]) names no rule (NotImplementedError too, as slime raises)."""


# ------------------------------------------------------------------ rules of our own (not in slime)

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def math_reward(response: str, label: Any) -> float:
    """`--rm-type boxed`: the boxed answer against the label, as `math` grades it, as a float."""
    return 1.0 if grade_answer_verl(response, label) else 0.0


def _gsm8k_extract(text: str) -> str | None:
    """The first number after the last `####`, else the last number of the text."""
    if "####" in text:
        m = _NUMBER.search(text.rsplit("####", 1)[1])
        return m.group(0) if m else None
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _as_number(s: str) -> float | None:
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def gsm8k_reward(response: str, label: Any) -> float:
    """`--rm-type gsm8k`: the final number of the response (`#### n`, else the last number)
    equals the label's (`#### n` or a bare number), numerically."""
    label = str(label)
    gold = _gsm8k_extract(label) if "####" in label else label.strip()
    pred = _gsm8k_extract(response)
    if gold is None or pred is None:
        return 0.0
    a, b = _as_number(pred), _as_number(gold)
    if a is not None and b is not None:
        return 1.0 if abs(a - b) <= 1e-9 * max(1.0, abs(b)) else 0.0
    return 1.0 if mathd_normalize_answer(pred) == mathd_normalize_answer(gold) else 0.0


def exact_reward(response: str, label: Any) -> float:
    """`--rm-type exact`: the response, stripped, is the label."""
    return 1.0 if str(response).strip() == str(label).strip() else 0.0


def f1_reward(response: str, label: Any) -> float:
    """`--rm-type f1`: slime's token F1 (articles and punctuation dropped)."""
    return f1_score(response, label)[0]


def _math(response: str, label: Any) -> int:
    return 1 if grade_answer_verl(response, label) else 0


# name -> (function(response, label[, metadata]), takes metadata, CPU-heavy)
_RULES: dict[str, tuple[Any, bool, bool]] = {
    "math": (_math, False, True),
    "deepscaler": (get_deepscaler_rule_based_reward, False, True),
    "dapo": (compute_score_dapo, False, False),
    "f1": (f1_reward, False, False),
    "gpqa": (compute_gpqa_reward, True, False),
    "ifbench": (None, True, True),  # imported on first use: its checkers are an optional dependency
    "boxed": (math_reward, False, True),
    "gsm8k": (gsm8k_reward, False, False),
    "exact": (exact_reward, False, False),
}
RM_TYPES: tuple[str, ...] = (*_RULES, "remote_rm", "random")


def _split_type(rm_type: str) -> tuple[str, bool]:
    """("math", True) for "boxed_math"."""
    return (rm_type[len("boxed_") :], True) if rm_type.startswith("boxed_") else (rm_type, False)


def check_rm_type(rm_type: str | None, *, args: Any = None) -> None:
    """Reject an unknown `--rm-type` at start-up (and `remote_rm` without `--rm-url`, `ifbench`
    without its checkers), naming the flag. None/"" pass: a custom rm may be set instead."""
    if not rm_type or not rm_type.strip():
        return
    name, _ = _split_type(rm_type.strip())
    if name not in RM_TYPES:
        known = ", ".join([*RM_TYPES, "boxed_<type>"])
        raise UnknownRmType(
            f"--rm-type {rm_type!r}: unknown reward type; choose one of {known}, or set --custom-rm-path"
        )
    if name == "ifbench" and ifbench_available() is None:
        raise UnknownRmType(_IFBENCH_MISSING)
    if name == "remote_rm" and args is not None and not args.rm_url:
        raise ValueError("--rm-type remote_rm needs --rm-url (the reward server's URL)")


async def remote_rm(args: Any, sample: Sample, max_retries: int = 10) -> Any:
    """POST `{"prompt", "response", "label"}` to `--rm-url`; the reward is the JSON answer."""
    from slime.utils.http_utils import post

    url = args.rm_url
    if not url:
        raise ValueError("--rm-type remote_rm needs --rm-url (the reward server's URL)")
    payload = {"prompt": sample.prompt, "response": sample.response, "label": sample.label}
    return await post(url, payload, max_retries=max_retries)


def _rule(args: Any, sample: Sample) -> tuple[str, Any, bool]:
    """(rule name, the call computing the sample's reward, CPU-heavy) for its `metadata["rm_type"]` or
    `--rm-type`; the call is None for `remote_rm` and `random`. Custom reward paths are the caller's."""
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    source = "metadata['rm_type']" if metadata.get("rm_type") else "--rm-type"
    rm_type = (metadata.get("rm_type") or args.rm_type or "").strip()
    if not rm_type:
        raise UnknownRmType("no reward: set --rm-type, --custom-rm-path, or metadata['rm_type'] per sample")
    name, boxed_only = _split_type(rm_type)
    if name in ("remote_rm", "random"):
        return name, None, False
    if name not in _RULES:
        raise UnknownRmType(
            f"{source} {rm_type!r}: unknown reward type; choose one of "
            f"{', '.join([*RM_TYPES, 'boxed_<type>'])}, or set --custom-rm-path"
        )
    response, label = sample.response, sample.label
    if boxed_only:
        response = extract_boxed_answer(response) or ""
    fn, with_metadata, heavy = _RULES[name]
    if name == "ifbench":
        from slime.rollout.rm_hub.ifbench import compute_ifbench_reward as fn
    call = (lambda: fn(response, label, metadata=metadata)) if with_metadata else (lambda: fn(response, label))
    return name, call, heavy


def inline_rule(args: Any, sample: Sample) -> Any:
    """The sample's reward as a plain call when `async_rm` would compute it in this thread without awaiting
    anything (a built-in rule, not CPU-heavy, no custom reward path): the reward step then needs no task
    and no deadline for it (a deadline cannot stop a call that never yields). None otherwise; calling it
    may raise what `async_rm` raises."""
    if getattr(sample, "custom_rm_path", None) or args.custom_rm_path:
        return None
    try:
        _, call, heavy = _rule(args, sample)
    except Exception:  # noqa: BLE001 - async_rm raises it again, where the reward step reports it
        return None
    return None if heavy else call


async def async_rm(args: Any, sample: Sample, **kwargs: Any) -> Any:
    """The reward of one sample (see the module docstring for the order of precedence)."""
    args = completed(args)
    path = getattr(sample, "custom_rm_path", None)
    if path:
        return await load_function(path, "Sample.custom_rm_path")(args, sample, **kwargs)
    path = args.custom_rm_path
    if path:
        return await load_function(path, "--custom-rm-path")(args, sample, **kwargs)
    name, call, heavy = _rule(args, sample)
    if name == "remote_rm":
        return await remote_rm(args, sample)
    if name == "random":
        return random.randint(0, 1)
    return await asyncio.to_thread(call) if heavy else call()


async def batched_async_rm(args: Any, samples: list[Sample], **kwargs: Any) -> list[Any]:
    """Rewards of a list: `--custom-rm-path` gets the whole list (`async fn(args, samples)`),
    else each sample goes through `async_rm`."""
    args = completed(args)
    path = args.custom_rm_path
    if path:
        rewards = await load_function(path, "--custom-rm-path")(args, samples, **kwargs)
        if not isinstance(rewards, (list, tuple)) or len(rewards) != len(samples):
            got = f"{len(rewards)} rewards" if isinstance(rewards, (list, tuple)) else type(rewards).__name__
            raise ValueError(
                f"--custom-rm-path {path!r} in batch mode must return one reward per sample: "
                f"got {got} for {len(samples)} samples"
            )
        return list(rewards)
    return list(await asyncio.gather(*(async_rm(args, s, **kwargs) for s in samples)))
