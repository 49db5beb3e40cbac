"""An image directory's names (an image's and a build's hash) and how one is measured and
removed without crossing into a mount a dead build left inside it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from aamp.sandbox.image_commands import ImageBuildError

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}\Z")


def mounts_below(path: Path) -> list[str]:
    """Mount points at or under `path` in this mount namespace, deepest first."""
    prefix = str(path)
    found: list[str] = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as info:
        for entry in info:
            point = entry.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def remove_tree(path: Path) -> None:
    """Delete a build directory, first unmounting anything left mounted inside it."""
    for point in mounts_below(path):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    if mounts_below(path):
        raise ImageBuildError(f"cannot remove {path}: something is still mounted inside it")
    shutil.rmtree(path, ignore_errors=True)


def disk_usage(root: Path) -> int:
    """Bytes allocated under `root`, hard links once, never crossing into a mount (a dead
    build can leave /proc mounted in its chroot) and ignoring entries that vanish."""
    try:
        top = os.lstat(root)
    except OSError:
        return 0
    seen: set[int] = set()
    device, total = top.st_dev, top.st_blocks * 512
    pending = [str(root)]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_dev != device or st.st_ino in seen:
                continue
            seen.add(st.st_ino)
            total += st.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
    return total
