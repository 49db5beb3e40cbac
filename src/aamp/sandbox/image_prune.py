"""Removing what no one needs from the image directory: every built image that is not its
name's current one and that no live sandbox holds, and what dead builds and prunes left.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import NamedTuple

from aamp.digests import is_sha256
from aamp.sandbox.image_commands import Progress
from aamp.sandbox.image_dirs import NAME_RE, disk_usage, remove_tree
from aamp.sandbox.image_locks import build_lock, exclusive_if_unused


class Pruned(NamedTuple):
    """One directory `ImageStore.prune` removed (or, in a dry run, would remove).

    `content_hash` is the image's hash; for a leftover (an unfinished build, a copy replaced
    by `build --force`, an interrupted prune) it is that directory's name, which starts with
    a dot."""

    name: str
    content_hash: str
    size_bytes: int


def prune(root: Path, *, dry_run: bool, progress: Progress) -> list[Pruned]:
    """Delete every built image that is not the current one of its name, except those a
    live sandbox holds (see `hold_image`), plus what interrupted builds and prunes left.

    Each name is pruned under the same lock its builds take, so a prune never sees a
    build half-way (and `.build-*` directories found then are dead builds' leftovers).
    An image is first renamed to `.prune-*` while its use lock is held exclusively, so a
    sandbox starting at that instant fails cleanly instead of booting from a tree being
    deleted; a prune killed mid-way leaves only `.prune-*` leftovers, which the next one
    removes. A name without a valid `current` link keeps its images (nothing says which
    one is wanted). With `dry_run` nothing is changed and the same list is returned.
    """
    pruned: list[Pruned] = []
    if not root.is_dir():
        return pruned
    for name_dir in sorted(root.iterdir()):
        if name_dir.is_symlink() or not name_dir.is_dir() or not NAME_RE.match(name_dir.name):
            continue
        with build_lock(name_dir / ".lock", progress, name_dir.name):
            pruned += _prune_name(name_dir, dry_run=dry_run, progress=progress)
    return pruned


def _prune_name(name_dir: Path, *, dry_run: bool, progress: Progress) -> list[Pruned]:
    name = name_dir.name
    try:
        current: str | None = os.readlink(name_dir / "current")
    except OSError:
        current = None
    if current is not None and not is_sha256(current):
        current = None
    verb = "would remove" if dry_run else "removing"
    pruned: list[Pruned] = []
    for entry in sorted(name_dir.iterdir()):
        label = entry.name
        if entry.is_symlink():
            if label.startswith(".current-") and not dry_run:  # a half-made current link
                entry.unlink(missing_ok=True)
            continue
        if not entry.is_dir():
            continue
        if is_sha256(label):
            if label == current:
                continue
            if current is None:
                progress(f"[{name}] no current image, so {label[:12]} is left alone")
                continue
            what, check_use = "old image", True
        elif label.startswith(".retired-"):
            what, check_use = "replaced image", True
        elif label.startswith(".build-"):
            what, check_use = "unfinished build", False
        elif label.startswith(".prune-"):
            what, check_use = "interrupted prune", False
        else:
            continue
        shown = label[:12] if is_sha256(label) else label
        size = disk_usage(entry)
        with contextlib.ExitStack() as stack:
            if check_use and not stack.enter_context(
                exclusive_if_unused(entry, create=not dry_run)
            ):
                progress(f"[{name}] keeping {what} {shown}: a running sandbox uses it")
                continue
            progress(f"[{name}] {verb} {what} {shown} ({size / 2**20:.0f} MiB)")
            if dry_run:
                pruned.append(Pruned(name, label, size))
                continue
            doomed = entry
            if not label.startswith(".prune-"):
                doomed = name_dir / f".prune-{label.lstrip('.')[:40]}-{secrets.token_hex(4)}"
                entry.rename(doomed)  # while holding the use lock: nobody can start on it
        remove_tree(doomed)
        if doomed.exists():
            progress(f"[{name}] could not remove all of {doomed}; the next prune retries")
            continue
        pruned.append(Pruned(name, label, size))
    return pruned
