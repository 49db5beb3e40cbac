"""Who holds an image: the per-name build lock (one build or prune of a name at a time) and the
shared use lock each live sandbox holds on its image directory, which prune and rebuild try
exclusively and never wait for.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from aamp.sandbox.image_commands import HEARTBEAT_SECONDS, Progress

USE_LOCK = "use.lock"  # in each image directory; see hold_image
HOLD_TIMEOUT_SECONDS = 10.0  # prune and build hold a use lock exclusively only for a rename


class ImageUnavailable(RuntimeError):
    """A sandbox could not take hold of an image directory (pruned or replaced meanwhile)."""


@contextlib.contextmanager
def build_lock(lock_path: Path, progress: Progress, name: str) -> Iterator[None]:
    """Hold an exclusive fcntl lock; say so while waiting for another build to finish."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            started = time.monotonic()
            progress(f"[{name}] waiting for another build of '{name}' to finish ({lock_path})")
            last_note = started
            while True:
                time.sleep(0.2)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as again:
                    if again.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                now = time.monotonic()
                if now - last_note >= HEARTBEAT_SECONDS:
                    progress(f"[{name}] still waiting for the other build ({now - started:.0f}s)")
                    last_note = now
        yield
    finally:
        os.close(fd)  # closing releases the lock


class ImageUse:
    """A shared lock on one image directory, held while a sandbox runs from that image."""

    def __init__(self, fd: int, directory: Path) -> None:
        self._fd: int | None = fd
        self.directory = directory

    def release(self) -> None:
        """Let go of the image (idempotent); `prune` may then remove it."""
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None


def hold_image(directory: Path) -> ImageUse:
    """Mark the image in `directory` (an image's HASH directory) as in use until `release`.

    Why a lock and not a scan for who uses the files: gVisor's gofer reaches the tree through
    a bind mount in its own mount namespace and Firecracker under the jailer through a hard
    link, so neither this host's mount table nor /proc/*/fd reliably names the image
    directory; an fcntl lock is exact, needs no shared registry, and vanishes with the
    process that held it. Each sandbox takes its own shared lock (its own open file, so two
    sandboxes in one process are two holders); `prune` and `build --force` try the lock
    exclusively without waiting and keep the image if that fails. The lock lives in the aamp
    process that owns the sandbox (the descriptor is close-on-exec, never inherited by the
    guest's processes): if that process crashes, its orphaned guests are killed by the
    driver's `reap` at the next start, so the image they used is free then anyway.

    After locking, the path must still name the locked file: prune renames an image away
    (and build --force swaps it) while holding the lock exclusively, and a sandbox that
    opened the old file must not believe it holds the directory now at that path.
    """
    deadline = time.monotonic() + HOLD_TIMEOUT_SECONDS
    while (use := _try_hold(directory)) is None:
        if time.monotonic() > deadline:
            raise ImageUnavailable(f"image {directory} is being removed or replaced; try again")
        time.sleep(0.01)
    return use


async def hold_image_async(directory: Path) -> ImageUse:
    """`hold_image` without blocking the event loop: one attempt here, which never waits and
    is what almost every create needs (microseconds, where a thread hop costs milliseconds on
    a cold start's path), and only if the lock is busy, the waiting in a thread."""
    use = _try_hold(directory)
    return use if use is not None else await asyncio.to_thread(hold_image, directory)


def _try_hold(directory: Path) -> ImageUse | None:
    """One attempt at the shared lock, never waiting: the use, or None if prune or a rebuild
    holds the lock exclusively or the path was renamed away meanwhile (try again)."""
    path = directory / USE_LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        raise ImageUnavailable(
            f"image directory {directory} no longer exists (pruned or rebuilt meanwhile)"
        ) from None
    except OSError as exc:
        raise ImageUnavailable(f"cannot lock image {directory}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        held, now = os.fstat(fd), _stat_or_none(path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
        return ImageUse(fd, directory)
    os.close(fd)  # renamed away while we waited: look again at what the path names now
    return None


def _stat_or_none(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


@contextlib.contextmanager
def exclusive_if_unused(directory: Path, *, create: bool) -> Iterator[bool]:
    """True (holding the image's use lock exclusively for the block) if no sandbox uses the
    image in `directory`; False if one does. Never waits. Without `create` (a dry run) a
    missing lock file means nobody ever held it, and nothing is written."""
    flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(directory / USE_LOCK, flags, 0o644)
    except FileNotFoundError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            free = True
        except BlockingIOError:
            free = False
        yield free
    finally:
        os.close(fd)
