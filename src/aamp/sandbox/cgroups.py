"""A sandbox's cgroup directories on this host: removing them, and what their counters say.

Both drivers leave cgroups behind (runsc does not remove its own; the jailer's outlive a
killed VM), so destroy and reap remove them here, one rule for both: children first, and a
directory still busy has whatever is left in it killed, then is retried, bounded.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from aamp.sandbox import procs

CGROUP_ROOT = Path("/sys/fs/cgroup")
# A cgroup's CPU weight (v1 `cpu.shares`), which only counts against its siblings' when they
# compete for CPU: the kernel's default, and what a warm pool's sandbox boots at (an eighth: a
# sandbox in use beside it gets 8/9 of the CPU; `aamp.sandbox.pool_fill`). Not the lowest (2):
# the kernel scales the installation's cgroup parent down by its children's weights, so at 2
# the pool's boots starved against the host's other work (load 20 on 2 cores: a refill took
# ~3 s, the pool ran dry at one create a second; at 128 it kept up).
NORMAL_CPU_SHARES = 1024
BACKGROUND_CPU_SHARES = 128


def version() -> int:
    """2 on a unified (cgroup v2) hierarchy, else 1."""
    return 2 if (CGROUP_ROOT / "cgroup.controllers").exists() else 1


def controllers() -> list[Path]:
    """The hierarchies mounted under /sys/fs/cgroup (v1: one per controller, aliases skipped)."""
    if not CGROUP_ROOT.is_dir():
        return []
    return [p for p in CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink()]


def remove_sandbox(parent: str, sandbox_id: str) -> None:
    """Remove the cgroups of one sandbox under `parent`, in every hierarchy (v1 and v2)."""
    for controller in [*controllers(), CGROUP_ROOT]:
        remove_tree(controller / parent / sandbox_id)


def remove_parent(parent: str) -> None:
    """Remove an installation's cgroup parent and every sandbox cgroup left under it."""
    for controller in controllers():
        path = controller / parent
        if not path.is_dir():
            continue
        for child in path.iterdir():
            if child.is_dir():
                remove_tree(child)
        remove_tree(path)


def remove_tree(path: Path) -> None:
    """Remove one cgroup directory (after its processes are gone: rmdir fails while busy)."""
    if not path.is_dir():
        return
    for child in path.iterdir():
        if child.is_dir():
            remove_tree(child)
    for attempt in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            # Busy: a process is still exiting. Kill anything left in it and retry briefly.
            procs_file = path / "cgroup.procs"
            try:
                for pid in procs_file.read_text().split():
                    procs.kill_pid(int(pid), signal.SIGKILL)
            except OSError:
                pass
            time.sleep(0.02 * (attempt + 1) if attempt < 10 else 0.2)


def set_cpu_shares(parent: str, sandbox_id: str, shares: int) -> None:
    """Set the CPU weight of one sandbox's (v1) cpu cgroup under `parent`; OSError if it has
    none (the sandbox is gone)."""
    (CGROUP_ROOT / "cpu" / parent / sandbox_id / "cpu.shares").write_text(f"{shares}\n")


def cpu_shares(parent: str, sandbox_id: str) -> int:
    """The CPU weight of one sandbox's (v1) cpu cgroup under `parent`."""
    return int((CGROUP_ROOT / "cpu" / parent / sandbox_id / "cpu.shares").read_text())


def death_reason(parent: str, sandbox_id: str) -> str:
    """Why a sandbox stopped, from the counters its (v1) cgroups kept."""
    try:
        if int((CGROUP_ROOT / "memory" / parent / sandbox_id / "memory.failcnt").read_text()):
            return "it reached its memory limit"
    except (OSError, ValueError):
        pass
    try:
        events = (CGROUP_ROOT / "pids" / parent / sandbox_id / "pids.events").read_text()
        if int(events.split()[1]) > 0:
            return "it reached its process limit"
    except (OSError, ValueError, IndexError):
        pass
    return "its guest exited"
