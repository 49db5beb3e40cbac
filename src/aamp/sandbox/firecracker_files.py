"""The files of a VM root: the image, kernel and snapshot placed in it (a symlink; in a jail a
hard link or a read-only bind mount), its sparse scratch disk, and the host tools that do it,
each with a deadline and a `DriverError` naming what failed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from aamp.sandbox.driver import DriverError


def place(jailed: bool, src: Path, dst: Path) -> None:
    """Make `src` visible as `dst` inside the VM root: a symlink without the jailer; in a
    jail a hard link (same filesystem) or a read-only bind mount."""
    dst.unlink(missing_ok=True)
    if not jailed:
        dst.symlink_to(src.resolve())
        return
    try:
        os.link(src, dst)
        return
    except OSError:
        pass
    dst.touch()
    tool(["mount", "--bind", str(src), str(dst)], f"binding {src} into the jail")
    tool(["mount", "-o", "remount,bind,ro", str(dst)], f"making {dst} read-only")


def make_scratch(path: Path, size: int) -> None:
    """A sparse file of `size` bytes with an empty ext4 on it: costs almost no disk until the
    guest writes."""
    with path.open("wb") as fh:
        fh.truncate(size)
    tool(
        ["mkfs.ext4", "-q", "-F", "-m", "0", "-L", "workspace", str(path)],
        "mkfs.ext4 of the scratch disk",
    )


def sparse_copy(src: Path, dst: Path) -> None:
    tool(["cp", "--sparse=always", str(src), str(dst)], f"copying {src}", timeout=600)


def tool(argv: list[str], what: str, timeout: float = 120.0) -> None:
    """Run a host tool with a deadline; any failure is a DriverError naming what failed."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise DriverError(f"{what} failed: {argv[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise DriverError(f"{what} did not finish within {timeout:.0f}s") from None
    if done.returncode != 0:
        raise DriverError(f"{what} failed: {done.stderr.strip() or done.stdout.strip()}")
