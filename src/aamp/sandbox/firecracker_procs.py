"""A Firecracker sandbox's host processes, found and stopped from /proc and its record alone.

A pid alone is not an identity (pids are reused), so a process is the pid together with its
start time (`start_ticks`), checked again before anything is signalled; and a VM that started
before its pid reached the record is still found by its arguments or its root directory.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from aamp.sandbox import procs
from aamp.sandbox.firecracker_api import API_SOCK


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: start time in clock ticks since boot. With the pid it
    identifies one process for good (a reused pid has a later start time)."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(rest[19])
    except (OSError, IndexError, ValueError):
        return None


def is_our_vm(record: dict[str, Any]) -> bool:
    """Is the recorded pid still the very firecracker we started (not a reused pid)?"""
    pid = int(record.get("pid") or 0)
    if pid <= 0 or not procs.pid_alive(pid) or start_ticks(pid) != record.get("start_ticks"):
        return False
    args = procs.cmdline(pid)
    if not args:
        return False
    first = Path(args[0]).name
    return first in ("firecracker", "jailer") and str(record.get("sandbox_id")) in args


def vm_pids(record: dict[str, Any]) -> list[int]:
    """Firecracker/jailer processes of this sandbox, found from /proc alone: `--id <id>` and
    either its absolute API socket in the arguments (unjailed) or, jailed, a root directory
    that is this sandbox's VM root (same inode; /proc/<pid>/root follows pivot_root)."""
    sandbox_id = str(record.get("sandbox_id"))
    vm_root = Path(str(record.get("vm_root")))
    try:
        root_stat = vm_root.stat()
    except OSError:
        root_stat = None
    found = []
    for pid in procs.pids_matching("--id", sandbox_id):
        args = procs.cmdline(pid)
        if not args or Path(args[0]).name not in ("firecracker", "jailer"):
            continue
        if str(vm_root / API_SOCK) in args:
            found.append(pid)
            continue
        try:
            proc_root = Path(f"/proc/{pid}/root").stat()
        except OSError:
            continue
        if root_stat and (proc_root.st_ino, proc_root.st_dev) == (
            root_stat.st_ino,
            root_stat.st_dev,
        ):
            found.append(pid)
    return found


def owner_alive(record: dict[str, Any]) -> bool:
    pid = int(record.get("owner_pid") or 0)
    return pid > 0 and procs.pid_alive(pid) and start_ticks(pid) == record.get("owner_start_ticks")


def stop_pid(pid: int, term_wait: float = 2.0, kill_wait: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `term_wait`; returns when the pid is gone or a zombie,
    after at most term_wait + kill_wait seconds."""
    procs.kill_pid(pid, signal.SIGTERM)
    for sig, wait in ((signal.SIGKILL, term_wait), (None, kill_wait)):
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and procs.pid_alive(pid):
            time.sleep(0.005)
        if not procs.pid_alive(pid):
            return
        if sig is not None:
            procs.kill_pid(pid, sig)


def unmount_under(state_dir: Path) -> None:
    """Unmount every mount point below `state_dir` (the jail's bind mounts), deepest first."""
    prefix = str(state_dir.resolve()) + "/"
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    points = [line.split()[4] for line in lines if len(line.split()) > 4]
    points = [p.encode().decode("unicode_escape") for p in points if p.startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=30, check=False)
