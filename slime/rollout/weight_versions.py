"""Weight versions as numbers, and how far behind the current one a sample's oldest segment is.

Engines report versions as strings of ints (`Sample.weight_versions`, one per segment); the
fully-async rollout's `--max-staleness` compares the oldest against the current version.
"""

from __future__ import annotations

from typing import Any

from slime.utils.types import Sample


def version_number(version: Any) -> int | None:
    """A weight version as an int (engines report strings of ints); None when it is not one."""
    try:
        return int(str(version))
    except (TypeError, ValueError):
        return None


def oldest_version(sample: Sample) -> int | None:
    versions = getattr(sample, "weight_versions", None) or []
    return version_number(versions[0]) if versions else None


def staleness(sample: Sample, current: int | None) -> int | None:
    """How many versions the sample's oldest segment is behind `current` (None: unknown)."""
    oldest = oldest_version(sample)
    return None if oldest is None or current is None else max(0, current - oldest)
