"""Grading an agent's workspace so that nothing in the workspace can stand in for the grader.

The grade command runs in the grader's own directory (`GRADER_DIR`), outside the workspace and
made fresh after the workspace is unpacked; the sample's `grade_files` are written there, never
over the workspace. The workspace is at `$SLIME_WORKSPACE`. For Python, imports resolve in this
order: the grader's directory, the standard library and installed packages, and only then the
workspace -- by a finder appended to `sys.meta_path` from a `sitecustomize` of ours (on
`PYTHONPATH`), not a `sys.path` entry, so the workspace's modules are found only when nothing
else has that name and its metadata (entry points: pytest plugins) is never scanned. And
`PYTHONSAFEPATH` (Python >= 3.11) keeps Python from putting the working directory or a script's
directory first, so a grade command that `cd`s into the workspace does not undo this. So a
`test_<name>/` package or a `unittest/` package planted in the workspace cannot replace the
grader's tests or the test runner, and a `conftest.py` there is outside pytest's reach.

What this does not do: code the tests import from the workspace runs inside the grader's process.
A task whose reward must survive hostile code has to check the results out of that process.
"""

from __future__ import annotations

import shlex

from slime.agent.sandboxes.sandbox import Sandbox
from slime.agent.sandboxes.workspace import pack, upload

GRADER_DIR = "/tmp/grader"  # the grader's files and working directory (not under the workspace)
GRADER_SITE = "/tmp/.slime-grader-site"  # holds only our sitecustomize.py

SITECUSTOMIZE = '''"""slime's grading: the agent's workspace {workspace!r} is importable after everything else."""
import importlib.machinery
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_ours = sys.modules.pop(__name__)
try:
    import sitecustomize  # noqa: F401 - the interpreter's own, if it has one
except ImportError:
    pass
sys.modules[__name__] = _ours


class WorkspaceFinder:
    """Finds a top-level module in the workspace, asked only after every other finder failed;
    a workspace package's submodules are found through its own __path__ as usual."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if path is not None:
            return None
        return importlib.machinery.PathFinder.find_spec(name, [{workspace!r}])


sys.meta_path.append(WorkspaceFinder)
'''


def grader_env(workspace: str) -> dict[str, str]:
    """The grade command's environment: where the workspace is, and the import order above."""
    return {
        "HOME": "/home/agent",
        "SLIME_WORKSPACE": workspace,
        "SLIME_GRADER_DIR": GRADER_DIR,
        "PYTHONPATH": f"{GRADER_DIR}:{GRADER_SITE}",
        "PYTHONSAFEPATH": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


async def install_grader(sb: Sandbox, grade_files: dict[str, str], workspace: str) -> None:
    """The grader's directory, made after the workspace is in place (whatever the workspace
    unpacked there is removed first), holding `grade_files`; and our sitecustomize."""
    await sb.exec(
        f"rm -rf {shlex.quote(GRADER_DIR)} {shlex.quote(GRADER_SITE)} && "
        f"mkdir -p {shlex.quote(GRADER_DIR)} {shlex.quote(GRADER_SITE)}",
        check=True,
        timeout=60,
    )
    await sb.write_file(f"{GRADER_SITE}/sitecustomize.py", SITECUSTOMIZE.format(workspace=workspace))
    if grade_files:
        await upload(sb, GRADER_DIR, pack(grade_files))
