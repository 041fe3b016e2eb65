"""An agent's workspace: what a sample seeds it with, and how it travels between sandbox sessions.

A sample's metadata may carry `files` ({relative path: text}), `git` ({"repo": path or URL,
"rev": commit}, checked out on the host: a sandbox has no way out but the gateway),
`grade_files` (the grader's own files, run from a directory of their own: `grading.py`) and
`grade_command` (exit 0 = solved). Workspaces travel as gzipped tars in parts, so no single request
or answer grows with the workspace (a sandbox caps both: its body limit and the 1 MiB one read
returns): `upload` writes parts of at most `UPLOAD_PART_BYTES`; `download` reads `READ_PART_BYTES`
at a time as base64 through `exec` (the one call every `Sandbox` backend has) and checks the
size and SHA-256 of what it put together. The tar waits next to the workspace, never inside it.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import shlex
import subprocess
import tarfile
import tempfile
from pathlib import PurePosixPath
from typing import Any

from slime.agent.sandboxes.sandbox import Sandbox
from slime.utils.misc import get_by_path

TRANSFER_SUFFIX = ".slime-transfer"  # `<workdir><suffix>`: the tar in transit, beside the workspace
UPLOAD_PART_BYTES = 4 << 20  # per write_file: its base64 request body (5.6 MB) is far under a body cap
READ_PART_BYTES = 384 << 10  # per read: its base64 (512 KiB) fits the 1 MiB output one exec returns
GIT_TIMEOUT = 300.0  # seconds a host-side clone may take


class WorkspaceError(ValueError):
    """A sample's workspace fields are malformed; the message names the sample and the field."""


@dataclasses.dataclass(frozen=True)
class GitSource:
    repo: str
    rev: str = "HEAD"


@dataclasses.dataclass(frozen=True)
class WorkspaceSeed:
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    git: GitSource | None = None
    grade_files: dict[str, str] = dataclasses.field(default_factory=dict)
    grade_command: str | None = None

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any] | None, who: str) -> WorkspaceSeed:
        md = metadata or {}
        git = md.get("git")
        if git is not None and not (isinstance(git, dict) and isinstance(git.get("repo"), str)):
            raise WorkspaceError(f"{who}: metadata.git must be {{'repo': path or URL, 'rev': commit}}, got {git!r}")
        command = md.get("grade_command")
        if command is not None and not (isinstance(command, str) and command.strip()):
            raise WorkspaceError(f"{who}: metadata.grade_command must be a non-empty shell command, got {command!r}")
        return cls(
            files=_file_map(md.get("files"), f"{who}: metadata.files"),
            git=GitSource(git["repo"], str(git.get("rev") or "HEAD")) if git else None,
            grade_files=_file_map(md.get("grade_files"), f"{who}: metadata.grade_files"),
            grade_command=command,
        )

    def tarball(self) -> bytes:
        """The seeded workspace as a gzipped tar: the git checkout, then `files` over it."""
        base = git_tarball(self.git) if self.git else None
        return pack(self.files, base=base)


def _file_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WorkspaceError(f"{where} must map relative paths to file contents, got {type(value).__name__}")
    for path, text in value.items():
        p = PurePosixPath(str(path))
        if p.is_absolute() or ".." in p.parts or not p.parts or "\x00" in str(path):
            raise WorkspaceError(f"{where}: {path!r} must be a relative path inside the workspace (without NUL)")
        if not isinstance(text, str):
            raise WorkspaceError(f"{where}[{path!r}] must be the file's text, got {type(text).__name__}")
    return dict(value)


def pack(files: dict[str, str], *, base: bytes | None = None) -> bytes:
    """A gzipped tar of `base`'s members (if any) with `files` added over them."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        if base is not None:
            with tarfile.open(fileobj=io.BytesIO(base), mode="r:*") as src:
                for member in src.getmembers():
                    if member.name.lstrip("./") in files:
                        continue
                    tar.addfile(member, src.extractfile(member) if member.isfile() else None)
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def unpack(data: bytes) -> dict[str, bytes]:
    """The regular files of a gzipped tar, by relative path (for checks and tests)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def git_tarball(src: GitSource) -> bytes:
    """`src.rev` of `src.repo` as a gzipped tar, with its `.git` (agents may diff against it)."""
    with tempfile.TemporaryDirectory(prefix="slime-agent-git-") as tmp:
        for cmd in (
            ["git", "clone", "--quiet", "--no-checkout", src.repo, tmp],
            ["git", "-C", tmp, "checkout", "--quiet", src.rev],
        ):
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=GIT_TIMEOUT)
            if done.returncode != 0:
                raise WorkspaceError(
                    f"metadata.git: `{' '.join(cmd)}` failed for {src.repo!r} at {src.rev!r}: "
                    f"{done.stderr.strip()[-500:]}"
                )
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w:gz") as tar:
            tar.add(tmp, arcname=".")
        return out.getvalue()


def transfer_path(workdir: str) -> str:
    return workdir.rstrip("/") + TRANSFER_SUFFIX


async def upload(sb: Sandbox, workdir: str, data: bytes, *, timeout: int = 120) -> None:
    """Unpack the gzipped tar `data` into `workdir` of the session, sent in parts."""
    parts = transfer_path(workdir)
    await sb.exec(
        f"rm -rf {shlex.quote(parts)} && mkdir -p {shlex.quote(parts)} {shlex.quote(workdir)}",
        timeout=timeout,
        check=True,
    )
    for n, start in enumerate(range(0, max(len(data), 1), UPLOAD_PART_BYTES)):
        await sb.write_file(f"{parts}/{n:06d}", data[start : start + UPLOAD_PART_BYTES])
    await sb.exec(
        f"cd {shlex.quote(workdir)} && cat {shlex.quote(parts)}/* | tar xzf - && rm -rf {shlex.quote(parts)}",
        timeout=timeout,
        check=True,
    )


async def download(sb: Sandbox, workdir: str, *, timeout: int = 120) -> bytes:
    """The session's `workdir` as a gzipped tar, read in parts; its size and SHA-256 checked. tar writes a file
    (no pipeline), so its own status decides: a file it cannot read fails the copy, its message naming the file."""
    tar = shlex.quote(transfer_path(workdir))
    made = await sb.exec(
        f"cd {shlex.quote(workdir)} && tar czf {tar} . && stat -c %s {tar} && sha256sum {tar}",
        timeout=timeout,
        check=True,
    )
    size_line, digest_line = made.stdout.splitlines()[:2]
    size, digest = int(size_line), digest_line.split()[0]
    parts = []
    for n in range(-(-size // READ_PART_BYTES)):
        got = await sb.exec(
            f"dd if={tar} bs={READ_PART_BYTES} skip={n} count=1 status=none | base64 -w0", timeout=timeout, check=True
        )
        parts.append(base64.b64decode(got.stdout))
    await sb.exec(f"rm -f {tar}", timeout=timeout)
    data = b"".join(parts)
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        raise RuntimeError(
            f"the workspace copied out of {workdir} is {len(data)} bytes with another SHA-256 than "
            f"the {size} bytes packed there"
        )
    return data


def check_prompt_rows(path: str, metadata_key: str | None) -> int:
    """Every JSONL row's workspace fields, as `CommandAgent` will read them; WorkspaceError names
    the file and line of the first bad one. Returns the rows checked (parquet: none, read at run)."""
    if not path.endswith((".jsonl", ".json")) or not metadata_key:
        return 0
    rows = 0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                metadata = get_by_path(json.loads(line), metadata_key)
            except (KeyError, ValueError):
                continue  # (the data checks report a broken row or a missing key themselves)
            WorkspaceSeed.from_metadata(metadata if isinstance(metadata, dict) else None, f"{path}:{lineno}")
            rows += 1
    return rows
