"""The manager's sandboxes on other hosts: a create the placer put on a registered host,
booted there over its link and recorded here, and those past their ttl that their hosts did
not end, reaped through the placer.

`OnOtherHosts` is a part of `SandboxManager` (`manager.py`), moved here unchanged: its methods
use the manager's placer and audit record.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aamp.sandbox.placer import Placer, SandboxElsewhere
from aamp.sandbox.requests import CreateRequest, SandboxUnavailable


class OnOtherHosts:
    """Creates placed on, and reaps of, sandboxes on other hosts."""

    placer: Placer | None
    _elsewhere: set[str]

    # the manager's
    _record_created: Callable[..., Awaitable[None]]
    _record_destroyed: Callable[..., Awaitable[None]]

    async def reap_elsewhere(self) -> list[str]:
        """The sandboxes on other hosts past their ttl that their hosts did not end (the
        fleet's sweep, every tick): reaped through the placer and recorded as this host's
        clock records its own (`sandbox.destroy`, reason `ttl`, naming the host)."""
        if self.placer is None:
            return []
        reaped = await self.placer.reap_expired()
        for sandbox_id, host in reaped:
            self._elsewhere.discard(sandbox_id)
            await self._record_destroyed(sandbox_id, "ttl", "system", {"host": host})
        return [sandbox_id for sandbox_id, _ in reaped]

    async def _create_elsewhere(
        self, driver_name: str, request: CreateRequest, actor: str
    ) -> SandboxElsewhere:
        """A create in a process that runs no sandbox itself: placed on a registered host,
        or the placer says why none can take it."""
        if self.placer is None:
            raise SandboxUnavailable("this process runs no sandboxes and places none")
        reservation = await self.placer.reserve(driver_name, request)
        remote = await self._boot_elsewhere(self.placer, reservation, request, actor)
        if remote is None:  # a placer that chose this process's host, which it does not have
            await self.placer.cancel(reservation)
            raise SandboxUnavailable("this process runs no sandboxes of its own")
        return remote

    async def _boot_elsewhere(
        self, placer: Placer, reservation: object, request: CreateRequest, actor: str
    ) -> SandboxElsewhere | None:
        """Boot it on the remote host it was placed on (None: placed on this process's)."""
        try:
            remote = await placer.boot_elsewhere(reservation, request, actor)
        except BaseException:
            await placer.cancel(reservation)
            raise
        if remote is not None:
            self._elsewhere.add(remote.id)
            await self._record_created(remote, actor)
        return remote
