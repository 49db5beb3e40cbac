"""`DriverDouble`: a test double of the isolation-driver contract (`aamp.sandbox.driver`), for
control planes in tests that never start a sandbox.

It isolates nothing and boots nothing. It exists so that tests of the API, identity, grants,
secrets and the audit log run on any machine, without root or runsc: their control plane has
an empty image directory, so a sandbox request that passes authorisation fails with "not
built" before any driver is asked to create anything. Should a test get as far as `create`
anyway, the double refuses and remembers it (`create_attempts`), and the plane that owns it
fails the test at teardown: such a test needs the real driver. Tests that boot sandboxes use
the real `GVisorDriver`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from aamp.sandbox.driver import Driver, DriverError, DriverStatus, SandboxHandle, SandboxSpec

if TYPE_CHECKING:
    from aamp.sandbox.images import BuiltImage


class DriverDouble(Driver):
    """Implements the contract just far enough for a manager to start and shut down."""

    name = "double"

    def __init__(self) -> None:
        self.create_attempts: list[str] = []

    def probe(self) -> DriverStatus:
        return DriverStatus(self.name, True, "a test double: it isolates nothing, boots nothing")

    # No guest ever dials these; the manager still listens on them while it asks `create`.
    def channel_path(self, state_dir: Path) -> Path:
        return state_dir / "agent.sock"

    def egress_path(self, state_dir: Path) -> Path:
        return state_dir / "egress.sock"

    async def create(
        self, sandbox_id: str, spec: SandboxSpec, image: BuiltImage, state_dir: Path
    ) -> SandboxHandle:
        self.create_attempts.append(sandbox_id)
        raise DriverError(
            f"DriverDouble boots nothing (asked for {sandbox_id}); a test that starts a "
            "sandbox needs the real driver"
        )

    def exited(self, handle: SandboxHandle) -> str | None:
        return "the DriverDouble never ran a guest"

    async def destroy(self, handle: SandboxHandle) -> None:
        return None  # it made nothing, so there is nothing to remove

    async def reap(self, runtime_dir: Path) -> list[str]:
        return []  # nothing it could have left behind
