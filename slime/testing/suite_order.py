"""The suite's order: pytest-randomly's shuffle, with each test package's files kept together.

Why: pytest-randomly shuffles the modules of the whole suite, so the four files of `tests/weight_sync` land
far apart and their package fixtures (an engine fork server, three engines, reference answers: ~20 s on 2
cores) are torn down and set up again for each file. Grouped where the package's first file landed, they are
set up once, and the suite is still in random order: the modules of each folder in the shuffled order, the
folders in the order the shuffle first reached them.
"""

from __future__ import annotations

from typing import Any


def group_by_folder(items: list[Any]) -> list[Any]:
    """`items` (pytest items, or anything with a `.path`) reordered so that those of one folder are
    consecutive; a stable sort, so the order within a folder is kept."""
    first: dict[Any, int] = {}
    for i, item in enumerate(items):
        first.setdefault(item.path.parent, i)
    return sorted(items, key=lambda item: first[item.path.parent])


def xdist_scope(nodeid: str) -> str:
    """What `make test WORKERS=N` (pytest-xdist, `--dist loadfile`) hands one worker whole: a file at the top
    of tests/, or a whole sub-folder (tests/weight_sync: its package fixtures set up on one worker, once)."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else path


def folder_scheduler(config: Any, log: Any) -> Any:
    """xdist's `loadfile` scheduler, with a sub-folder's files as one unit (`xdist_scope`)."""
    from xdist.scheduler import LoadFileScheduling

    class LoadFolderScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return LoadFolderScheduling(config, log)
