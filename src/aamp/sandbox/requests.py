"""What a sandbox is asked for (`CreateRequest`: image, driver, lifetime, resources, egress
rules, services, packages, read-only host files, checked as it is made), and the errors a
request about sandboxes ends in, each with its stable code and status.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aamp.egress.rules import EgressRules
from aamp.egress.services import ServiceSet
from aamp.errors import AampError
from aamp.policy import DEFAULT_IDLE_SECONDS, DEFAULT_TTL_SECONDS, MAX_TTL_SECONDS, Resources
from aamp.sandbox.driver import ReadOnlyFile


class SandboxError(AampError, code="sandbox_error"):
    """A request about sandboxes cannot be served; `code` is stable, the message is for people."""


class UnknownSandbox(SandboxError, code="unknown_sandbox", status=404):
    """No live sandbox has this id (never made, or destroyed since)."""


class InvalidRequest(SandboxError, code="invalid_request"):
    """A create request this host cannot serve (an unknown image or driver, a bad lifetime)."""


class SandboxStopped(SandboxError, code="sandbox_stopped", status=410):
    """The sandbox stopped by itself (a limit, a crash); the message says why."""


class SandboxUnavailable(SandboxError, code="sandbox_unavailable", status=503):
    """A sandbox could not be started (the driver failed, or the guest did not come up)."""


def block_everything() -> EgressRules:
    return EgressRules.from_lists("block")


@dataclass(frozen=True)
class CreateRequest:
    image: str = "base"
    driver: str | None = None
    ttl: float = DEFAULT_TTL_SECONDS
    idle: float = DEFAULT_IDLE_SECONDS
    resources: Resources = field(default_factory=Resources)
    # What the sandbox may reach through its egress proxy; nothing unless a policy says so.
    egress: EgressRules = field(default_factory=block_everything)
    # The services whose credentials the proxy injects for this sandbox.
    services: ServiceSet = field(default_factory=ServiceSet)
    # A policy's `packages:` (`name==version`), installed from the wheelhouse in a derived
    # layer of the image (`ImageStore.with_packages`).
    packages: tuple[str, ...] = ()
    # Host files shown read-only in the guest (`ReadOnlyFile`); only drivers that can
    # (`can_mount_files`), and never from the warm pool: they are bound in at boot.
    read_only_files: tuple[ReadOnlyFile, ...] = ()

    def __post_init__(self) -> None:
        for name in ("ttl", "idle"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidRequest(f"{name} must be a number of seconds, got {value!r}")
            if not 0 < value <= MAX_TTL_SECONDS:
                raise InvalidRequest(
                    f"{name} must be between 1 and {MAX_TTL_SECONDS} seconds, got {value}"
                )
