"""`Placer`: what the sandbox manager asks before a sandbox boots and after it is gone — the
host it runs on, with that host's capacity reserved (`aamp.fleet.FleetPlacer`, the fleet's
placement). The manager stays blind to how hosts are chosen; with no placer (a manager on
its own, as in most tests) it boots wherever it runs, as before.

The order is the contract: `reserve` before anything boots (a refusal — no host has room,
this host is draining or lost — is raised to the caller and nothing boots), then `placed`
with the sandbox's id once it is up (the placer records the sandbox on its host), or
`cancel` if it never came up; `release` when it is destroyed, whatever ended it.
"""

from __future__ import annotations

from typing import Protocol

from aamp.policy import Resources


class Placer(Protocol):
    async def reserve(self, driver: str, image: str, resources: Resources) -> object:
        """Reserve room for one sandbox; returns the reservation, or raises why not."""
        ...

    async def placed(self, reservation: object, sandbox_id: str) -> str:
        """The sandbox booted under `reservation`: record it; returns its host's id."""
        ...

    async def cancel(self, reservation: object) -> None:
        """The sandbox never came up: give the reservation back."""
        ...

    async def release(self, sandbox_id: str) -> None:
        """The sandbox is gone: forget it and give its host's capacity back."""
        ...
