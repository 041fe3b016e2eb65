"""The suite's hypothesis settings (issue 36: a suite that passes every time): `make test` draws the same
examples on every run (the "ci" profile of tests/conftest.py), and `make test-explore` (HYPOTHESIS_PROFILE=explore)
draws fresh ones for every property, which it cannot for a test that pins `derandomize` itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _profile_settings(profile: str | None) -> dict:
    """derandomize and database of hypothesis' default settings once tests/conftest.py loaded `profile`."""
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_PROFILE"}
    if profile is not None:
        env["HYPOTHESIS_PROFILE"] = profile
    code = (
        "import tests.conftest\nfrom hypothesis import settings\n"
        "print(settings.default.derandomize, settings.default.database is None)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    return {"derandomize": out[0] == "True", "no_database": out[1] == "True"}


def test_the_suite_draws_fixed_examples_and_explore_draws_fresh_ones():
    assert _profile_settings(None) == {"derandomize": True, "no_database": True}
    assert _profile_settings("ci") == {"derandomize": True, "no_database": True}
    assert _profile_settings("explore")["derandomize"] is False


def test_no_test_pins_its_own_seed_policy():
    """A test's own derandomize setting outranks the profile: `make test-explore` would never explore it."""
    pinned = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in sorted((ROOT / "tests").rglob("*.py"))
        if p.name != "conftest.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bderandomize\s*=", line)
    ]
    assert pinned == []
