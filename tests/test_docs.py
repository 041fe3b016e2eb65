"""The docs cannot drift from the code: generated reference pages are fresh, every command in the README and the
docs parses with our own parser, the quick start's rollout command runs, and nothing points outside the repo."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import gen_docs  # noqa: E402  (tools/ is a folder of scripts, as in slime)

PROGRAMS = {
    "python -m slime": "slime-rollout",
    "slime-rollout": "slime-rollout",
    "python -m slime.train": "slime-train",
    "slime-train": "slime-train",
}
HAND_WRITTEN = [
    p
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    if "reference" not in p.relative_to(ROOT).parts or p.name == "benchmarks.md"
]


def code_blocks(text: str) -> list[str]:
    """Fenced blocks and 4-space indented blocks, as written."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)
    indented = [
        "\n".join(line[4:] for line in block.splitlines())
        for block in re.findall(r"(?:^\n)((?:^    \S.*\n)+)", text, flags=re.M)
    ]
    return fenced + indented


def commands(text: str) -> list[tuple[str, list[str]]]:
    """(program, argv) of every slime command in the text's code blocks, continuation lines joined."""
    out = []
    for block in code_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            for prefix, prog in sorted(PROGRAMS.items(), key=lambda kv: -len(kv[0])):
                if line.startswith(prefix + " ") and line[len(prefix) :].lstrip().startswith("--"):
                    out.append((prog, shlex.split(line[len(prefix) :])))
                    break
    return out


def documented_commands() -> list[tuple[str, str, list[str]]]:
    return [
        (path.relative_to(ROOT).as_posix(), prog, argv)
        for path in HAND_WRITTEN
        for prog, argv in commands(path.read_text())
    ]


def test_the_reference_pages_are_what_the_code_gives():
    assert gen_docs.stale_pages() == [], "run `python tools/gen_docs.py` (or `make docs`)"


def test_a_changed_parser_makes_the_flag_page_stale(monkeypatch):
    real = gen_docs.flags_page
    monkeypatch.setitem(
        gen_docs.PAGES, "flags.md", lambda: real().replace("| `--rollout-seed` | `42` |", "| `--rollout-seed` | `43` |")
    )
    assert gen_docs.stale_pages() == ["flags.md"]


def test_the_docs_find_commands_in_every_shape_they_are_written():
    text = (
        "```bash\npython -m slime --num-rollout 2 \\\n  --rollout-seed 3   # two\n```\n\nrun it:\n\n"
        "    slime-train --lr 1e-5\n    --agent-timeout 5\n"
    )
    assert commands(text) == [
        ("slime-rollout", ["--num-rollout", "2", "--rollout-seed", "3"]),
        ("slime-train", ["--lr", "1e-5"]),
    ]


def test_the_docs_hold_commands():
    found = {path for path, _, _ in documented_commands()}
    assert {"README.md", "docs/quick-start.md", "docs/guides/debugging.md"} <= found


@pytest.mark.parametrize(
    "where,prog,argv", documented_commands(), ids=lambda v: v if isinstance(v, str) and v.endswith(".md") else ""
)
def test_every_documented_command_parses_with_our_parser(where, prog, argv):
    from slime.cli.args import ArgError, parse_args
    from slime.cli.train import parse_train_args

    try:
        if prog == "slime-train":
            parse_train_args(argv)
        else:
            parse_args(argv, prog=prog)
    except (SystemExit, ArgError) as e:  # argparse exits on an unknown flag or a bad value
        pytest.fail(f"{where}: `{prog} {shlex.join(argv)}` does not parse: {e}")


def test_nothing_in_the_docs_points_outside_the_repository():
    outside = re.compile(r"\.\./shared|REFERENCE(\.md| §)|/work/|~/work")
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in HAND_WRITTEN
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if outside.search(line)
    ]
    assert offenders == []


def test_every_relative_link_of_the_readme_exists():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    missing = [link for link in links if not link.startswith("http") and not (ROOT / link).exists()]
    assert missing == []


@pytest.mark.slow
def test_the_quick_start_rollout_command_runs(tiny_model_dir, tmp_path):
    """The README's quick-start command, as written, on the tests' tiny model (shorter answers). It ends in
    order (issue 20): its exit hook finds nothing to stop (it says `stopped N leftover process(es) at exit`,
    naming them, only when something outlived its orderly stop)."""
    prog, argv = next(c for c in commands((ROOT / "README.md").read_text()) if "--debug-rollout-only" in c[1])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [
        *argv,
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--rollout-max-response-len",
        "8",
        "--log-dir",
        str(tmp_path / "logs"),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "slime", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if re.match(r"rollout \d+: samples=", line)]
    assert [line.split(":")[0] for line in lines] == ["rollout 0", "rollout 1"], proc.stdout[-2000:]
    assert all("samples=16" in line and "failed=0" in line for line in lines), lines
    assert "done: 2 rollout(s)" in proc.stdout
    assert "leftover" not in proc.stdout + proc.stderr, proc.stderr[-3000:]


@pytest.mark.slow
def test_the_debugging_guides_save_then_replay_commands_give_the_same_batch(tiny_model_dir, tmp_path):
    """docs/guides/debugging.md's two commands, as written (run in a scratch directory holding the repo's
    configs/), on the tiny model: the first saves the rollout, the second replays it without engines."""
    save, replay = [argv for _, argv in commands((ROOT / "docs/guides/debugging.md").read_text())][:2]
    assert "--save-debug-rollout-data" in save and "--load-debug-rollout-data" in replay
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    tiny = ["--hf-checkpoint", str(tiny_model_dir), "--rollout-max-response-len", "8"]
    outs = []
    for argv in (save, replay):
        proc = subprocess.run(
            [sys.executable, "-m", "slime", *argv, *tiny, "--log-dir", str(tmp_path / "logs")],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs.append([line for line in proc.stdout.splitlines() if re.match(r"rollout 0: samples=", line)])
    saved = tmp_path / "outputs/debug/rollout_0.pt"
    assert saved.is_file()
    import torch

    samples = torch.load(saved, weights_only=True)["samples"]
    assert samples and all(s["tokens"] for s in samples)
    # the replay reports the same rollout: same sample count and rewards (it never reached an engine)
    assert outs[0] and outs[1] and outs[0][0].split("tokens/s")[0] == outs[1][0].split("tokens/s")[0]


def test_the_sandbox_guides_synopsis_is_the_servers_parser():
    """docs/guides/sandbox.md's `slime-sandbox` synopsis names every flag the server takes (the two a parent
    process passes it excepted) and no other, and each number it shows is that flag's default."""
    from slime.sandbox.server import _parser

    synopsis = next(
        b for b in code_blocks((ROOT / "docs/guides/sandbox.md").read_text()) if b.startswith("slime-sandbox ")
    )
    shown = dict(re.findall(r"(--[a-z-]+)(?: ([^\s\]]+))?", synopsis))
    parser = {a.option_strings[0]: a.default for a in _parser()._actions if a.option_strings[0].startswith("--")}
    internal = {"--help", "--fd", "--lifeline-fd"}  # a parent's handover, not a user's
    assert set(shown) == set(parser) - internal
    numbers = {flag: value for flag, value in shown.items() if re.fullmatch(r"\d+(\.\d+)?", value)}
    assert numbers and {flag: float(value) for flag, value in numbers.items()} == {
        flag: float(parser[flag]) for flag in numbers
    }
