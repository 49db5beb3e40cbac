"""Artifacts: files the agent left in /workspace/out, and the browser's downloads in
/workspace/downloads (named `downloads/NAME`), checked against the policy's `data.outbound`,
hashed while they are copied out, and kept content-addressed under
$AAMP_HOME/artifacts/<run>/<sha256>.

The guest's listing is untrusted: names are re-checked on the host, sizes are enforced while
copying (a file that grows past its limit is cut off and refused), and the hash is of the bytes
actually received.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

from aamp.policy.model import DataRule
from aamp.sandbox import GuestChannel

WORKSPACE = "/workspace"
OUT_DIR = "/workspace/out"
DOWNLOADS_DIR = "/workspace/downloads"
ROOTS = (OUT_DIR, DOWNLOADS_DIR)  # where artifacts come from, in order of precedence
NAME_RE = re.compile(r"^[A-Za-z0-9._-][A-Za-z0-9._ /-]{0,254}\Z")


@dataclass(frozen=True)
class Candidate:
    name: str  # relative to /workspace/out; a download's is downloads/NAME
    size: int
    path: str = ""  # in the guest, relative to /workspace (default: out/NAME)

    @property
    def guest_path(self) -> str:
        return posixpath.join(WORKSPACE, self.path or posixpath.join("out", self.name))


class ArtifactRefused(Exception):
    """A file that may not leave under the policy; the message names the rule."""


def file_type(name: str) -> str:
    return posixpath.splitext(name)[1].lstrip(".").lower()


def check(candidate: Candidate, rule: DataRule, used: int) -> None:
    """Refuse a file whose type or size the policy's `data.outbound` does not allow."""
    if not NAME_RE.match(candidate.name) or ".." in candidate.name.split("/"):
        raise ArtifactRefused(f"{candidate.name!r}: not a usable artifact name")
    kind = file_type(candidate.name)
    if kind not in rule.types:
        allowed = ", ".join(rule.types) or "none"
        raise ArtifactRefused(
            f"{candidate.name}: data.outbound.types does not allow {kind or 'no extension'!r} "
            f"(allowed: {allowed})"
        )
    if used + candidate.size > rule.max_bytes:
        raise ArtifactRefused(
            f"{candidate.name}: data.outbound.max_bytes is {rule.max_bytes} bytes; this file "
            f"({candidate.size} bytes) would bring the run's output to {used + candidate.size}"
        )


def candidates(listing: object) -> tuple[list[Candidate], list[tuple[Candidate, str]]]:
    """The guest's listing of /workspace (entries [path, size]) narrowed to out/ files and
    downloads/ files, and the downloads refused because a file in out/ has their name."""
    out: list[Candidate] = []
    clashes: list[tuple[Candidate, str]] = []
    if not isinstance(listing, list):
        return out, clashes
    for entry in listing:
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], str)
            and isinstance(entry[1], int)
        ):
            continue
        path, size = entry
        if path.startswith("out/"):
            out.append(Candidate(path[4:], size, path))
        elif path.startswith("downloads/"):
            out.append(Candidate(path, size, path))
    names: set[str] = set()
    kept = []
    for candidate in sorted(out, key=lambda c: not c.path.startswith("out/")):
        if candidate.name in names:
            reason = (
                f"{candidate.name}: a file in /workspace/out has this name already; the "
                f"download /workspace/{candidate.path} is not kept"
            )
            clashes.append((candidate, reason))
            continue
        names.add(candidate.name)
        kept.append(candidate)
    return kept, clashes


async def copy_out(
    channel: GuestChannel, candidate: Candidate, dest_dir: Path, limit: int
) -> tuple[Path, int, str]:
    """Copy one file out of the guest into `dest_dir`, hashing it; at most `limit` bytes."""
    dest_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = dest_dir / f".incoming-{os.getpid()}-{id(candidate)}"
    digest = hashlib.sha256()
    size = 0
    try:
        stream = await channel.get(candidate.guest_path)
        async with stream:
            with open(tmp, "wb") as f:
                async for chunk in stream:
                    size += len(chunk)
                    if size > limit:
                        raise ArtifactRefused(
                            f"{candidate.name}: grew past data.outbound.max_bytes while copied"
                        )
                    digest.update(chunk)
                    f.write(chunk)
        sha = digest.hexdigest()
        final = dest_dir / sha
        os.replace(tmp, final)
        return final, size, sha
    finally:
        tmp.unlink(missing_ok=True)
