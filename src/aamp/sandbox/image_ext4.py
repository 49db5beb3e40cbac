"""The image's tree as an ext4 file (Firecracker's root drive), made reproducibly from the
image's content hash, and the tree's size on disk.
"""

from __future__ import annotations

import hashlib
import math
import os
import uuid
from pathlib import Path

from aamp.sandbox.image_commands import Progress, command_env, find_tool, run_command

EXT4_LABEL = "aamp-root"
# ext4 timestamps (superblock, root) come from here, not the clock, for reproducibility.
EXT4_FAKE_TIME = "1700000000"


def tree_usage(root: Path) -> tuple[int, int]:
    """(bytes allocated on disk, inode count) of a tree; hard links counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    pending = [str(root)]
    while pending:
        directory = pending.pop()
        st = os.lstat(directory)
        seen.add((st.st_dev, st.st_ino))
        total += st.st_blocks * 512
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                    continue
                est = entry.stat(follow_symlinks=False)
                key = (est.st_dev, est.st_ino)
                if key not in seen:
                    seen.add(key)
                    total += est.st_blocks * 512
    return total, len(seen)


def _derived_uuid(content_hash: str, purpose: str) -> str:
    return str(uuid.UUID(bytes=hashlib.sha256(f"{content_hash}:{purpose}".encode()).digest()[:16]))


def make_ext4(rootfs: Path, ext4: Path, content_hash: str, progress: Progress) -> None:
    """The tree as an ext4 file (Firecracker's root drive), reproducibly from its hash."""
    size, inodes = tree_usage(rootfs)
    mib = 2**20
    fs_bytes = math.ceil((size * 1.3 + 64 * mib) / mib) * mib
    inode_count = inodes + inodes // 3 + 1024
    env = command_env()
    env["E2FSPROGS_FAKE_TIME"] = EXT4_FAKE_TIME
    uuid_ = _derived_uuid(content_hash, "fs-uuid")
    seed = _derived_uuid(content_hash, "hash-seed")
    run_command(
        [find_tool("mkfs.ext4"), "-F", "-q", "-b", "4096", "-L", EXT4_LABEL, "-U", uuid_,
         "-E", f"root_owner=0:0,hash_seed={seed}", "-N", str(inode_count), "-m", "0",
         "-d", str(rootfs), str(ext4), f"{fs_bytes // 1024}k"],
        label="mkfs.ext4",
        progress=progress,
        env=env,
    )  # fmt: skip
