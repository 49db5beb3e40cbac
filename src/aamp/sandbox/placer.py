"""`Placer`: what the sandbox manager asks before a sandbox boots and after it is gone — the
host it runs on, with that host's capacity reserved (`aamp.fleet.FleetPlacer`, the fleet's
placement). The manager stays blind to how hosts are chosen; with no placer (a manager on
its own, as in most tests) it boots wherever it runs, as before.

The order is the contract: `reserve` before anything boots (a refusal — no host has room,
this host is draining or lost — is raised to the caller and nothing boots), then `placed`
with the sandbox's id once it is up (the placer records the sandbox on its host), or
`cancel` if it never came up; `release` when it is destroyed, whatever ended it.

A placer may place on hosts on other machines: then `boot_elsewhere` boots it there and
returns the sandbox as seen from here (`find` reaches it again, `elsewhere` lists them); it
returns None for this process's host.
Its egress rules change and its egress events are viewed over the link too
(`update_egress_elsewhere`, `egress_view_elsewhere`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from aamp.egress.recent import EgressView
    from aamp.egress.rules import EgressRules
    from aamp.egress.services import ServiceSet
    from aamp.sandbox.manager import CreateRequest


class SandboxElsewhere(Protocol):
    """A sandbox on another host: described by its host, reached through its link."""

    id: str
    image: str
    driver: str
    warm: bool
    host: str
    link: Any

    def describe(self) -> dict[str, object]: ...


class Placer(Protocol):
    async def reserve(self, driver: str, request: CreateRequest) -> object:
        """Reserve room for one sandbox booted with `driver` as `request` asks (its image,
        resources and packages: a host that has that layer already is preferred); returns
        the reservation, or raises why not."""
        ...

    async def boot_elsewhere(
        self, reservation: object, request: CreateRequest, actor: str
    ) -> SandboxElsewhere | None:
        """Boot it on the remote host it was placed on; None if placed on this process's."""
        ...

    async def find(self, sandbox_id: str) -> SandboxElsewhere:
        """A sandbox on another host, or `UnknownSandbox`."""
        ...

    async def destroy_elsewhere(self, sandbox_id: str, reason: str, actor: str) -> str | None:
        """Destroy it on its remote host and forget it; the host's id, or None if it is not
        on another host."""
        ...

    async def approver_elsewhere(self, sandbox_id: str, answering: bool, timeout: float) -> None:
        """Tell the remote host of `sandbox_id` that this replica answers its egress
        questions (each within `timeout` seconds), or (`answering` False) that nobody does."""
        ...

    async def update_egress_elsewhere(
        self,
        sandbox: SandboxElsewhere,
        rules: EgressRules,
        services: ServiceSet | None,
        actor: str,
    ) -> None:
        """Give the sandbox's host's proxy new rules (and services, None: unchanged) over its
        link; raises, with nothing changed, if the host could not be told."""
        ...

    def egress_view_elsewhere(self, sandbox: SandboxElsewhere) -> EgressView:
        """A view of the sandbox's egress events, as its host's proxy decides them."""
        ...

    async def elsewhere(self) -> list[SandboxElsewhere]:
        """Every live sandbox on other hosts."""
        ...

    async def placed(self, reservation: object, sandbox_id: str, ttl: float) -> str:
        """The sandbox booted under `reservation`, to end `ttl` seconds from now: record it;
        returns its host's id."""
        ...

    async def reap_expired(self) -> list[tuple[str, str]]:
        """Forget the sandboxes on other hosts past their expiry and have their hosts destroy
        them; each (sandbox, host) reaped."""
        ...

    async def cancel(self, reservation: object) -> None:
        """The sandbox never came up: give the reservation back."""
        ...

    async def release(self, sandbox_id: str) -> None:
        """The sandbox is gone: forget it and give its host's capacity back."""
        ...
