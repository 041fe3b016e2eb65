"""Errors for people: one summary line, then the frames of the user's own code (file and line).

A plugin's exception crosses a Ray actor boundary, which keeps its traceback only as text; the
frames worth showing are the ones outside slime, Ray, installed packages and the standard
library, i.e. the user's plugin.
"""

from __future__ import annotations

import re
import sysconfig
import traceback
from pathlib import Path

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>.+)$')
_SLIME_DIR = str(Path(__file__).resolve().parents[1])
_NOT_USER = tuple(
    {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], _SLIME_DIR}
)


def is_user_file(path: str) -> bool:
    if path.startswith("<") or "site-packages" in path or "dist-packages" in path:
        return False
    return not str(Path(path).resolve()).startswith(_NOT_USER)


def _frames_from_text(text: str) -> list[str]:
    lines, out = text.splitlines(), []
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if m and is_user_file(m["file"]):
            code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
            out.append(f'  File "{m["file"]}", line {m["line"]}, in {m["fn"]}' + (f"\n    {code}" if code else ""))
    return out


def user_frames(exc: BaseException) -> list[str]:
    """The user's frames of `exc`: from its traceback, or from the text a Ray error carries."""
    if getattr(exc, "cause", None) is not None or type(exc).__module__.startswith("ray"):
        return _frames_from_text(str(exc))
    out = []
    for fs in traceback.extract_tb(exc.__traceback__):
        if is_user_file(fs.filename):
            out.append(
                f'  File "{fs.filename}", line {fs.lineno}, in {fs.name}' + (f"\n    {fs.line}" if fs.line else "")
            )
    return out


def describe(exc: BaseException, prog: str) -> str:
    cause = getattr(exc, "cause", None) or exc
    text = f"{prog}: error: {type(cause).__name__}: {cause}"
    frames = user_frames(exc)
    if frames:
        text += "\nin your code (most recent call last):\n" + "\n".join(frames)
    return text
