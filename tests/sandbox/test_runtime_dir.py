"""The runtime directory: one holder at a time, and gone after a clean release."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from aamp.sandbox.runtime_dir import LOCK_NAME, RuntimeDir, RuntimeDirBusy

HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from aamp.sandbox.runtime_dir import RuntimeDir
    held = RuntimeDir.claim(Path(sys.argv[1]))
    print("held", flush=True)
    sys.stdin.readline()
    if sys.argv[2] == "release":
        held.release()
    """
)


def _holder(path, how: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_second_process_is_refused_until_the_first_lets_go(tmp_path):
    path = tmp_path / "run"
    holder = _holder(path, "release")
    with pytest.raises(RuntimeDirBusy, match="held by another process"):
        RuntimeDir.claim(path)
    holder.communicate("\n", timeout=10)
    assert not path.exists()  # released cleanly with nothing in it
    again = RuntimeDir.claim(path)
    again.release()


def test_a_crashed_holder_leaves_the_directory_to_the_next_claim(tmp_path):
    path = tmp_path / "run"
    holder = _holder(path, "crash")
    (path / "sb" / "sb-000000000000").mkdir(parents=True)
    holder.kill()
    holder.wait(timeout=10)
    assert (path / LOCK_NAME).exists()  # the kernel dropped the lock; the file stays
    held = RuntimeDir.claim(path)
    assert (path / "sb" / "sb-000000000000").is_dir()  # evidence for the reap
    held.release()
    assert not path.exists()


def test_release_removes_empty_directories_and_keeps_anything_with_files(tmp_path):
    path = tmp_path / "run"
    held = RuntimeDir.claim(path)
    (path / "sb" / "sb-0123456789ab").mkdir(parents=True)
    (path / "runsc").mkdir()
    (path / "sb" / "sb-ba9876543210").mkdir()
    (path / "sb" / "sb-ba9876543210" / "record.json").write_text("{}")
    held.release()
    held.release()  # idempotent
    assert sorted(p.relative_to(path).as_posix() for p in path.rglob("*")) == [
        LOCK_NAME,
        "sb",
        "sb/sb-ba9876543210",
        "sb/sb-ba9876543210/record.json",
    ]
    # The lock was given up: the next holder gets it at once.
    RuntimeDir.claim(path).release()


def test_a_lock_on_a_file_removed_meanwhile_is_taken_again_on_the_new_file(tmp_path):
    """The window `release` leaves: a newcomer opened the lock file just before the holder
    unlinked it. It must not keep a lock on a file no one else can see."""
    path = tmp_path / "run"
    path.mkdir()
    stale = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    os.unlink(path / LOCK_NAME)
    real_open = os.open
    calls = []

    def open_the_stale_file_first(file, flags, mode=0o777):
        calls.append(file)
        return os.dup(stale) if len(calls) == 1 else real_open(file, flags, mode)

    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(os, "open", open_the_stale_file_first)
            held = RuntimeDir.claim(path)
        assert len(calls) == 2
        named, locked = os.stat(path / LOCK_NAME), os.fstat(held._lock_fd)
        assert (named.st_dev, named.st_ino) == (locked.st_dev, locked.st_ino)
        held.release()
    finally:
        os.close(stale)
