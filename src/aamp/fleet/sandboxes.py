"""`FleetPlacer`: the sandbox manager's placer (`aamp.sandbox.placer`) — every sandbox is
placed through `Placement` (its host's capacity reserved in the placement's transaction) and
recorded as a `sandboxes` row naming its host and the host's epoch; destroying it gives the
capacity back and forgets the row.

A replica reaches only the sandbox host in its own process (`aamp host serve`, a host on
another machine taking placements over a link, is not built: docs/deployment.md), so the
candidates are that one host (`among`): a create is refused, naming the rule, when it is
draining, lost or full — never sent to a host nobody here can drive. With `aamp up` on one
machine that host is `local`, with room for what the machine holds.

When a host is marked lost (`HostRegistry.mark_lost`) its rows become `lost` with the reason;
`lost` tells the run service which of its runs' sandboxes are gone and why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlalchemy import select

from aamp.fleet.placement import Need, NoCapacity, Placed, Placement, give_back
from aamp.policy import Resources
from aamp.store import Store
from aamp.store.tables import HostRow, SandboxRow
from aamp.store.timestamps import now

MIB = 2**20


@dataclass(frozen=True)
class Reservation:
    placed: Placed
    need: Need


class FleetPlacer:
    def __init__(self, placement: Placement, host_id: str) -> None:
        self.placement = placement
        self.host_id = host_id  # the one host this process can drive

    @property
    def store(self) -> Store:
        return self.placement.registry.store

    async def reserve(self, driver: str, image: str, resources: Resources) -> Reservation:
        need = Need(driver, image, resources.cpus, math.ceil(resources.memory_bytes / MIB))
        placed = await self.store.run(self.placement.place, need, (self.host_id,))
        return Reservation(placed, need)

    async def placed(self, reservation: object, sandbox_id: str) -> str:
        assert isinstance(reservation, Reservation)
        placed, need = reservation.placed, reservation.need

        def record() -> None:
            with self.store.write_session() as s:
                host = s.get(HostRow, placed.host_id, with_for_update=True)
                if host is None or host.epoch != placed.epoch or host.state == "lost":
                    raise NoCapacity(
                        f"host {placed.host_id} was lost or registered again while sandbox "
                        f"{sandbox_id} started; it is not used"
                    )
                s.add(
                    SandboxRow(
                        id=sandbox_id,
                        host_id=placed.host_id,
                        host_epoch=placed.epoch,
                        state="live",
                        millicpus=need.millicpus,
                        memory_mb=need.memory_mb,
                        created_at=now(),
                    )
                )

        await self.store.run(record)
        return placed.host_id

    async def cancel(self, reservation: object) -> None:
        assert isinstance(reservation, Reservation)
        await self.store.run(self.placement.release, reservation.placed, reservation.need)

    async def release(self, sandbox_id: str) -> None:
        def forget() -> None:
            with self.store.write_session() as s:
                row = s.get(SandboxRow, sandbox_id, with_for_update=True)
                if row is None:
                    return  # its host registered again since: nothing is reserved
                give_back(s, row.host_id, row.host_epoch, row.millicpus, row.memory_mb)
                s.delete(row)

        await self.store.run(forget)

    def lost(self, sandbox_ids: set[str]) -> dict[str, str]:
        """(Blocking.) Of `sandbox_ids`, those lost with their host, and why."""
        if not sandbox_ids:
            return {}
        with self.store.session() as s:
            rows = s.execute(
                select(SandboxRow.id, SandboxRow.lost_reason).where(
                    SandboxRow.id.in_(sandbox_ids), SandboxRow.state == "lost"
                )
            ).all()
        return {r.id: r.lost_reason or "its host was lost" for r in rows}
