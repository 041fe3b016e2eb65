"""Why a rollout's samples failed, counted by reason, and the error raised when all of them did.

A sample that fails (retries spent, a reward that raised or is not a number, a tool error) is marked
FAILED with `metadata['failure_reason']` (short, countable) and `metadata['error']` (the full text).
The controller puts the counts into every rollout's summary and, when no sample is left to train,
raises `RolloutFailedError` whose message names each reason with one example, instead of a bare
"no samples" from the batch conversion.
"""

from __future__ import annotations

from collections import Counter

from slime.utils.types import Sample

EXAMPLE_CHARS = 600  # one example error per reason, cut to this length in the message


class RolloutFailedError(RuntimeError):
    """Every sample of a rollout failed; the message says why, by reason, with one example each."""

    def __init__(self, message: str, reasons: dict[str, int] | None = None):
        super().__init__(message)
        self.reasons = dict(reasons or {})

    def __reduce__(self):  # crosses the Ray actor boundary with its counts
        return type(self), (str(self), self.reasons)


def mark_failed(sample: Sample, reason: str, error: str) -> Sample:
    """FAILED, with a short reason (counted in the rollout's failure summary) and the full error."""
    sample.status = Sample.Status.FAILED
    sample.metadata["failure_reason"] = reason
    sample.metadata["error"] = error
    return sample


def failure_reasons(samples: list[Sample]) -> tuple[dict[str, int], dict[str, str]]:
    """FAILED samples counted by reason (`metadata['failure_reason']`), and one error text per reason."""
    counts: Counter = Counter()
    examples: dict[str, str] = {}
    for s in samples:
        if s.status != Sample.Status.FAILED:
            continue
        meta = s.metadata if isinstance(s.metadata, dict) else {}
        reason = str(meta.get("failure_reason") or "unknown")
        counts[reason] += 1
        examples.setdefault(reason, f"sample {s.index}: {meta.get('error') or 'no error recorded'}")
    return dict(counts.most_common()), examples


def describe_failures(rollout_id: int, samples: list[Sample]) -> str:
    """The message of `RolloutFailedError`: every reason with its count and one example."""
    counts, examples = failure_reasons(samples)
    lines = [f"rollout {rollout_id}: all {len(samples)} sample(s) failed; reasons:"]
    for reason, n in counts.items():
        example = examples[reason]
        cut = "..." if len(example) > EXAMPLE_CHARS else ""
        lines.append(f"  {reason}: {n} (e.g. {example[:EXAMPLE_CHARS]}{cut})")
    return "\n".join(lines)
