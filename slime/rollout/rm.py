"""Rewards: built-in rule-based checkers (`--rm-type`) and custom reward functions
(`--custom-rm-path`, slime's signatures `async rm(args, sample)` and, with `--group-rm`,
`async rm(args, samples) -> list`)."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from typing import Any

from slime.utils.misc import load_function
from slime.utils.types import Sample

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (braces balanced), or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


def normalize_answer(ans: str) -> str:
    s = str(ans).strip()
    s = re.sub(r"\\text\{(.*?)\}", r"\1", s)
    s = s.replace("\\!", "").replace("\\,", "").replace("$", "").replace("\\left", "").replace("\\right", "")
    s = s.replace("dfrac", "frac").replace("tfrac", "frac").replace(" ", "").rstrip(".")
    m = re.fullmatch(r"\\frac\{(-?\d+)\}\{(\d+)\}", s)
    if m and int(m.group(2)):
        return _num(int(m.group(1)) / int(m.group(2)))
    if _NUMBER.fullmatch(s):
        return _num(float(s.replace(",", "")))
    return s.lower()


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


def math_reward(response: str, label: Any) -> float:
    pred = last_boxed(response)
    if pred is None:
        return 0.0
    gold = last_boxed(str(label)) or str(label)
    return 1.0 if normalize_answer(pred) == normalize_answer(gold) else 0.0


def gsm8k_extract(text: str) -> str | None:
    """The answer after the last `####`, else the last number in the text."""
    if "####" in text:
        tail = text.rsplit("####", 1)[1]
        m = _NUMBER.search(tail)
        return m.group(0) if m else None
    nums = _NUMBER.findall(text)
    return nums[-1] if nums else None


def gsm8k_reward(response: str, label: Any) -> float:
    gold = gsm8k_extract(str(label)) if "####" in str(label) else str(label)
    pred = gsm8k_extract(response)
    if pred is None or gold is None:
        return 0.0
    return 1.0 if normalize_answer(pred) == normalize_answer(gold) else 0.0


def f1_reward(response: str, label: Any) -> float:
    pred, gold = str(response).lower().split(), str(label).lower().split()
    common = Counter(pred) & Counter(gold)
    same = sum(common.values())
    if not pred or not gold or same == 0:
        return 0.0
    p, r = same / len(pred), same / len(gold)
    return 2 * p * r / (p + r)


def exact_reward(response: str, label: Any) -> float:
    return 1.0 if str(response).strip() == str(label).strip() else 0.0


RULES = {"math": math_reward, "boxed": math_reward, "deepscaler": math_reward, "gsm8k": gsm8k_reward,
         "f1": f1_reward, "exact": exact_reward}


async def async_rm(args: Any, sample: Sample, **kwargs: Any) -> float | dict:
    """Reward of one sample: `--custom-rm-path` if set, else the `--rm-type` rule."""
    if getattr(args, "custom_rm_path", None):
        fn = load_function(args.custom_rm_path, "--custom-rm-path")
        return await fn(args, sample, **kwargs)
    rm_type = (getattr(args, "rm_type", None) or "").strip()
    if rm_type.startswith("boxed_"):  # slime's "boxed_<type>": grade only the boxed part
        rm_type = rm_type[len("boxed_"):]
        boxed = last_boxed(sample.response)
        response = boxed if boxed is not None else ""
    else:
        response = sample.response
    rule = RULES.get(rm_type)
    if rule is None:
        raise ValueError(f"--rm-type {rm_type!r}: unknown; choose one of {sorted(RULES)} or set --custom-rm-path")
    return rule(response, sample.label)


async def batched_async_rm(args: Any, samples: list[Sample]) -> list[float | dict]:
    """Rewards for a list of samples; with `--group-rm` the custom rm sees the whole list."""
    if getattr(args, "group_rm", False):
        if not getattr(args, "custom_rm_path", None):
            raise ValueError("--group-rm needs --custom-rm-path (a function rm(args, samples) -> list)")
        fn = load_function(args.custom_rm_path, "--custom-rm-path")
        rewards = await fn(args, samples)
        if len(rewards) != len(samples):
            raise ValueError(f"--custom-rm-path with --group-rm returned {len(rewards)} rewards for "
                             f"{len(samples)} samples")
        return list(rewards)
    return list(await asyncio.gather(*(async_rm(args, s) for s in samples)))
