"""The math graders live in `slime.utils.math_grading` (below tools and rollout); slime's module paths
`slime.rollout.rm_hub.math_utils`, `.symbolic`, `.braces` keep every name, as the very same objects."""

from __future__ import annotations

import subprocess
import sys

import slime.utils.math_grading.answers as answers
import slime.utils.math_grading.braces as braces
import slime.utils.math_grading.symbolic as symbolic
from slime.rollout.rm_hub import braces as rm_braces
from slime.rollout.rm_hub import math_utils as rm_math_utils
from slime.rollout.rm_hub import symbolic as rm_symbolic

_STDLIB = {
    "re",
    "unicodedata",
    "functools",
    "json",
    "logging",
    "os",
    "select",
    "subprocess",
    "sys",
    "threading",
    "time",
    "weakref",
    "Path",
    "logger",
    "annotations",
}


def _own_names(module) -> list[str]:
    return sorted(n for n in vars(module) if not n.startswith("__") and n not in _STDLIB)


def test_slime_paths_re_export_every_name_as_the_same_object():
    for moved, shim in ((answers, rm_math_utils), (symbolic, rm_symbolic), (braces, rm_braces)):
        names = _own_names(moved)
        assert names, moved.__name__
        assert [n for n in names if getattr(shim, n, None) is not getattr(moved, n)] == []
    assert rm_math_utils.__all__ is answers.__all__
    assert rm_math_utils._strip_string("\\dfrac{1}{2}") == "\\frac{1}{2}"  # slime's tests import this private one


def test_the_symbolic_worker_is_started_from_its_new_file():
    assert rm_symbolic._WORKER == symbolic._WORKER
    assert symbolic._WORKER.parent.name == "math_grading" and symbolic._WORKER.is_file()


def test_tools_grade_math_answers_without_importing_the_rollout_layer():
    code = (
        "import sys, slime.tools.geo3k_tool as g; print(g.geo3k_score('0.5', '\\\\frac{1}{2}'), "
        "sorted(m for m in sys.modules if m.startswith('slime.rollout')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1.0", "[]"]
