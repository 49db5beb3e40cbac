"""Host key files under $AAMP_HOME: created once, 0600, never world- or group-readable.

Used for the audit checkpoint signing key and the vault master key. Creation is atomic (the
full content is written to a private temporary file, fsynced, then hard-linked into place,
which fails if another process won the race), so a reader never sees half a key.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path


class KeyFileError(RuntimeError):
    """A key file is unusable; the message names the file and what is wrong (never its bytes)."""


def read_key_file(path: Path) -> bytes:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise KeyFileError(f"{path} does not exist") from None
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"{path} is not a regular file")
    if st.st_mode & 0o077:
        raise KeyFileError(
            f"{path} is readable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"it holds a key: run `chmod 600 {path}`"
        )
    return path.read_bytes()


def _written_beside(path: Path, content: bytes) -> Path:
    """`content` durably in a 0600 file next to `path` (same directory, so it can be linked or
    renamed into place), the directory made 0700 if missing."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def write_key_file(path: Path, content: bytes) -> bool:
    """Create `path` with `content` (0600) unless it exists; True if this call created it."""
    tmp = _written_beside(path, content)
    try:
        os.link(tmp, path)
        created = True
    except FileExistsError:
        created = False
    finally:
        os.unlink(tmp)
    if created:
        fsync_dir(path.parent)
    return created


def replace_key_file(path: Path, content: bytes) -> None:
    """Atomically put `content` at `path` (0600), replacing what is there."""
    os.replace(_written_beside(path, content), path)
    fsync_dir(path.parent)


def read_or_create_key_file(path: Path, make: Callable[[], bytes]) -> bytes:
    """The key in `path`, creating it with `make()` on first start."""
    if not path.exists():
        write_key_file(path, make())
    return read_key_file(path)


def fsync_dir(directory: Path) -> None:
    """Make a name just created in `directory` durable (the file's own fsync does not)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
