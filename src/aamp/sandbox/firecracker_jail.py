"""The optional jailer: who Firecracker runs as (`AAMP_FIRECRACKER_JAILER_UID` / `_GID`, never
root) and the cgroup limits it puts the VM in (the guest's memory plus Firecracker's own)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aamp.policy import MiB
from aamp.sandbox import cgroups
from aamp.sandbox.driver import DriverError
from aamp.sandbox.firecracker_api import API_SOCK
from aamp.sandbox.firecracker_binary import FirecrackerBinaries

# Firecracker's own memory next to the guest's, for the jailer's cgroup limit.
VMM_OVERHEAD = 256 * MiB
CGROUP_PARENT = "aamp-firecracker"


@dataclass(frozen=True)
class JailerConfig:
    """Run Firecracker through the jailer as `uid`:`gid` (never 0)."""

    uid: int
    gid: int

    @classmethod
    def from_env(cls, env: dict[str, str]) -> JailerConfig | None:
        uid, gid = env.get("AAMP_FIRECRACKER_JAILER_UID"), env.get("AAMP_FIRECRACKER_JAILER_GID")
        if not uid:
            return None
        try:
            config = cls(int(uid), int(gid if gid else uid))
        except ValueError:
            raise DriverError(
                f"AAMP_FIRECRACKER_JAILER_UID/_GID must be numbers, got uid={uid!r} gid={gid!r}"
            ) from None
        if config.uid <= 0 or config.gid <= 0:
            raise DriverError("the jailer must drop to a non-root uid and gid (> 0)")
        return config


def cgroup_args(version: int, memory_bytes: int, cpus: float) -> list[str]:
    limit = memory_bytes + VMM_OVERHEAD
    quota = max(1000, int(cpus * 100_000))
    if version == 1:
        pairs = [f"memory.limit_in_bytes={limit}", f"cpu.cfs_quota_us={quota}"]
    else:
        pairs = [f"memory.max={limit}", f"cpu.max={quota} 100000"]
    return [arg for pair in pairs for arg in ("--cgroup", pair)]


def jailer_argv(
    jail: JailerConfig,
    binaries: FirecrackerBinaries,
    sandbox_id: str,
    chroot_base: Path,
    memory_bytes: int,
    cpus: float,
) -> list[str]:
    """The jailer's command line: Firecracker chrooted under `chroot_base`, as the jail's
    uid/gid, in cgroups limited to the VM's memory and cpus."""
    assert binaries.jailer is not None
    version = cgroups.version()
    return [
        str(binaries.jailer), "--id", sandbox_id,
        "--exec-file", str(binaries.firecracker),
        "--uid", str(jail.uid), "--gid", str(jail.gid),
        "--chroot-base-dir", str(chroot_base),
        "--cgroup-version", str(version),
        "--parent-cgroup", CGROUP_PARENT,
        *cgroup_args(version, memory_bytes, cpus),
        "--", "--api-sock", API_SOCK,
    ]  # fmt: skip
