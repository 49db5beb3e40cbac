"""Who owns an installation's runtime directory (sockets, runsc state, sandbox state dirs).

One host process at a time: it holds an exclusive flock on `RUNTIME/lock` for as long as it
runs sandboxes. On a clean release the directory is removed once nothing is left in it, so an
installation that stops leaves no trace in /run; anything still there (a sandbox that would not
go) stays for the next start's reap.

Usage::

    held = RuntimeDir.claim(settings.runtime_dir)   # raises RuntimeDirBusy if another holds it
    ...
    held.release()
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_NAME = "lock"


class RuntimeDirBusy(RuntimeError):
    """Another live process holds this runtime directory."""


class RuntimeDir:
    def __init__(self, path: Path, lock_fd: int):
        self.path = path
        self._lock_fd: int | None = lock_fd

    @classmethod
    def claim(cls, path: Path) -> RuntimeDir:
        lock = path / LOCK_NAME
        # A releasing holder removes the lock file and then the directory; whoever opened the
        # old file in between would lock a file nobody else can see, so such a lock is dropped
        # and taken again on the file that is there now.
        for _ in range(20):
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
            except FileNotFoundError:  # the directory went away between mkdir and open
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RuntimeDirBusy(f"{path} is held by another process") from None
            if _same_file(fd, lock):
                return cls(path, fd)
            os.close(fd)
        raise RuntimeDirBusy(f"{path} keeps changing hands; try again")

    def release(self) -> None:
        """Give up the lock; remove the directory if only empty directories and the lock are
        left in it. Idempotent."""
        if self._lock_fd is None:
            return
        _remove_empty_dirs(self.path)
        with contextlib.suppress(OSError):
            if [p.name for p in self.path.iterdir()] == [LOCK_NAME]:
                # Unlinked while still held, so no one can lock the old file and think they own
                # the directory; a newcomer creates a fresh lock file (see `claim`).
                (self.path / LOCK_NAME).unlink()
                self.path.rmdir()
        os.close(self._lock_fd)
        self._lock_fd = None


def _same_file(fd: int, path: Path) -> bool:
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _remove_empty_dirs(root: Path) -> None:
    """rmdir every empty directory below `root`, deepest first; files and what holds them stay."""
    for dirpath, _dirnames, _files in os.walk(root, topdown=False):
        if dirpath != str(root):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
