"""What a run executes with: the languages, their source file and argv, the interpreter, the environment."""

from __future__ import annotations

import os
import shutil

from slime.sandbox.config import SandboxConfig


def find_python() -> str | None:
    for p in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if os.path.exists(p):
            return os.path.realpath(p)
    return None


LANGUAGES = {
    # language -> (source file, compile argv or None, run argv); "{py}" runs in the warm interpreter
    "python": ("main.py", None, ["{py}", "main.py"]),
    "python3": ("main.py", None, ["{py}", "main.py"]),
    "bash": ("main.sh", None, ["/bin/bash", "main.sh"]),
    "sh": ("main.sh", None, ["/bin/sh", "main.sh"]),
    "cpp": ("main.cpp", ["g++", "-O2", "-std=c++17", "-o", "main", "main.cpp"], ["./main"]),
    "c": ("main.c", ["gcc", "-O2", "-o", "main", "main.c", "-lm"], ["./main"]),
}


def available_languages(cfg: SandboxConfig) -> list[str]:
    out = []
    for lang, (_, comp, run) in LANGUAGES.items():
        if run[0] == "{py}" and not (cfg.python or find_python()):
            continue
        if comp and not shutil.which(comp[0]):
            continue
        out.append(lang)
    return out


def run_env() -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
