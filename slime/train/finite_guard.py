"""The trainer stops on a non-finite value: a loss term, the gradient or a weight that is NaN or inf
is named and the run stops before the optimizer step (and so before any push) or before the push.

Why: `--kl-loss-coef nan` trained (`loss=nan`, `grad_norm=nan`), NaN weights reached the engines, and
every request of the next rollout failed with an HTTP 500 a minute later without the NaN being named.
A NaN step is never taken: no skipping, since a run that keeps stepping past NaNs trains on garbage.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

# the step's terms, named as the metrics log names them (a key not there is not computed by this run)
STEP_TERMS = ("pg_loss", "kl_loss", "entropy_loss", "opd_reverse_kl", "loss", "grad_norm")
CAUSES = (
    "a NaN/inf coefficient set by a plugin, a reward of NaN/inf, log-probs of -inf (a teacher's or the "
    "engines'), or a learning rate too high for the model"
)


class NonFiniteError(RuntimeError):
    """A loss term, gradient or weight is NaN/inf; the message names it and what was not done."""


def nonfinite_terms(values: Mapping[str, Any]) -> list[str]:
    """The names of STEP_TERMS present in `values` that are not finite (floats or 0-d tensors)."""
    return [name for name in STEP_TERMS if name in values and not math.isfinite(float(values[name]))]


def check_step(rollout_id: int, step: int, values: Mapping[str, Any]) -> None:
    """Raise before the optimizer step when a term of it is not finite (values summed over every rank,
    so every rank raises alike and none waits in a collective for another)."""
    bad = nonfinite_terms(values)
    if bad:
        shown = ", ".join(f"{name}={float(values[name])}" for name in bad)
        raise NonFiniteError(
            f"rollout {rollout_id}, step {step}: {shown} is not finite; the step was not taken "
            f"and no weights were pushed (likely {CAUSES})"
        )


def first_nonfinite_tensor(named: Iterable[tuple[str, Any]]) -> str | None:
    """The name of the first tensor holding a NaN or inf (None: every value is finite)."""
    import torch

    for name, tensor in named:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return name
    return None


def check_weights(named: Iterable[tuple[str, Any]], what: str) -> None:
    """Refuse to hand weights on (`what`: "pushed to the engines", "saved") when one holds NaN/inf."""
    name = first_nonfinite_tensor(named)
    if name is not None:
        raise NonFiniteError(f"the weight {name} holds NaN/inf: not {what} (likely {CAUSES})")
