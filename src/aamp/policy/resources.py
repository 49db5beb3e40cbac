"""What a sandbox may use — cpus, memory, processes, disk — with the bounds every driver honours.

A policy's `resources:` section reads into this value, and the isolation drivers take the same
value in their `SandboxSpec` (`aamp.sandbox.driver`): one type and one set of bounds, so a
policy that parses is one every driver can run. Building one out of bounds raises
`ValueError` naming the field (`resources.memory must be at least 64MiB`).
"""

from __future__ import annotations

from dataclasses import dataclass

from aamp.policy.units import GiB, MiB


@dataclass(frozen=True)
class Resources:
    cpus: float = 1.0
    memory_bytes: int = 1 * GiB
    pids: int = 256
    disk_bytes: int = 2 * GiB

    def __post_init__(self) -> None:
        if not 0 < self.cpus <= 64:
            raise ValueError(f"resources.cpus must be in (0, 64], got {self.cpus}")
        if self.memory_bytes < 64 * MiB:
            raise ValueError("resources.memory must be at least 64MiB")
        if not 8 <= self.pids <= 65536:
            raise ValueError(f"resources.pids must be in [8, 65536], got {self.pids}")
        if self.disk_bytes < 16 * MiB:
            raise ValueError("resources.disk must be at least 16MiB")
