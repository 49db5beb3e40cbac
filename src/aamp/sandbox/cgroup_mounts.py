"""Whether named cgroup v1 controllers are mounted and writable for this process, in plain words.

A driver that puts limits on a sandbox through cgroups can only start one where the
controllers it writes are really there: mounted as a `cgroup` file system under
`/sys/fs/cgroup/NAME`, read-write, and writable by this user. An empty directory of that name
is not enough (runsc would create a plain directory in it and then fail to write the limit),
which is what a process sees inside `ip netns exec` (it remounts /sys, so /sys/fs/cgroup is
empty) or in a container that does not expose the host's cgroups. The truth is in
/proc/self/mountinfo, so that is what this reads.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class Mount:
    device: int
    point: str
    fstype: str
    mount_options: frozenset[str]
    super_options: frozenset[str]


def problems(
    controllers: Iterable[str], root: Path = CGROUP_ROOT, mountinfo: Path = MOUNTINFO
) -> str | None:
    """None when every controller is usable; otherwise one sentence saying what is wrong."""
    wanted = list(controllers)
    if (root / "cgroup.controllers").exists():
        return (
            f"{root} is a cgroup v2 (unified) hierarchy only; this driver needs the cgroup v1 "
            f"controllers {', '.join(wanted)}"
        )
    try:
        mounts = _mounts(mountinfo.read_text())
    except OSError as exc:
        return f"cannot read {mountinfo} to find the cgroup mounts: {exc.strerror or exc}"
    absent, read_only, not_writable = [], [], []
    for name in wanted:
        point = os.path.realpath(root / name)  # cpu may be a link to cpu,cpuacct
        mount = _visible(mounts, point)
        if mount is None or mount.fstype != "cgroup" or name not in mount.super_options:
            absent.append(name)
        elif "ro" in mount.mount_options or "ro" in mount.super_options:
            read_only.append(name)
        elif not os.access(point, os.W_OK):
            not_writable.append(name)
    reasons = []
    if absent:
        reasons.append(
            f"{_controllers(absent)} not mounted under {root} (as inside `ip netns exec`, "
            "which remounts /sys, or a container without the host's cgroups)"
        )
    if read_only:
        reasons.append(f"{_controllers(read_only)} mounted read-only")
    if not_writable:
        reasons.append(f"{_controllers(not_writable)} not writable by this user")
    return "; ".join(reasons) or None


def _controllers(names: list[str]) -> str:
    if len(names) == 1:
        return f"the cgroup controller {names[0]} is"
    return f"the cgroup controllers {', '.join(names)} are"


def _visible(mounts: list[Mount], point: str) -> Mount | None:
    """The mount a path really shows. mountinfo also lists mounts hidden under a later mount
    on a parent directory (a tmpfs over /sys/fs/cgroup), so the path's own device decides."""
    try:
        device = os.stat(point).st_dev
    except OSError:
        return None
    found = [m for m in mounts if m.point == point and m.device == device]
    return found[-1] if found else None


def _mounts(text: str) -> list[Mount]:
    mounts: list[Mount] = []
    for line in text.splitlines():
        # ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 3 or fields[2].count(":") != 1:
            continue
        major, minor = fields[2].split(":")
        point = _unescape(fields[4])
        mounts.append(
            Mount(
                device=os.makedev(int(major), int(minor)),
                point=point,
                fstype=tail[0],
                mount_options=frozenset(fields[5].split(",")),
                super_options=frozenset(tail[2].split(",")),
            )
        )
    return mounts


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash in paths as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
