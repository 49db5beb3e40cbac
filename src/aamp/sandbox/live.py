"""`Sandbox`: one live sandbox on this host, as the manager holds it — what it was booted
with, its guest channel and egress proxy, its lifetime (`expiry_reason`), and how it is
described to callers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from aamp.egress.proxy import EgressProxy
from aamp.policy import DEFAULT_IDLE_SECONDS, DEFAULT_TTL_SECONDS, Resources
from aamp.sandbox.channel.guest_channel import GuestChannel
from aamp.sandbox.driver import SandboxHandle


@dataclass
class Sandbox:
    id: str
    image: str
    image_hash: str
    driver: str
    resources: Resources
    handle: SandboxHandle
    channel: GuestChannel
    egress: EgressProxy
    # A request's own lifetime replaces these when the sandbox is handed out to it.
    ttl: float = DEFAULT_TTL_SECONDS
    idle: float = DEFAULT_IDLE_SECONDS
    created_at: float = field(default_factory=time.time)
    started_monotonic: float = field(default_factory=time.monotonic)
    active_uses: int = 0
    last_used: float = field(default_factory=time.monotonic)
    warm: bool = False  # handed out from a warm pool (booted before it was asked for)
    packages: tuple[str, ...] = ()  # from the wheelhouse, in the image's derived layer
    host: str | None = None  # the fleet host it was placed on (None: no placer)

    def expiry_reason(self, now: float) -> str | None:
        if now - self.started_monotonic >= self.ttl:
            return "ttl"
        last = max(self.last_used, self.channel.last_activity)
        if self.active_uses == 0 and now - last >= self.idle:
            return "idle"
        return None

    def describe(self) -> dict[str, object]:
        age = time.monotonic() - self.started_monotonic
        return {
            "id": self.id,
            "image": self.image,
            "image_hash": self.image_hash,
            "packages": list(self.packages),
            "driver": self.driver,
            "created_at": self.created_at,
            "ttl_seconds": self.ttl,
            "idle_seconds": self.idle,
            "expires_in": max(0.0, self.ttl - age),
            "warm": self.warm,
            "host": self.host,
            "resources": {
                "cpus": self.resources.cpus,
                "memory_bytes": self.resources.memory_bytes,
                "pids": self.resources.pids,
                "disk_bytes": self.resources.disk_bytes,
            },
        }
