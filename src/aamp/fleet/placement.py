"""`Placement`: choose the host a new sandbox runs on and reserve its capacity, in one
transaction.

The candidates are at most `k` hosts that are `active`, heartbeat within the lost timeout,
offer the driver, and have the cpus, memory and a sandbox slot free — the ones with the most
free slots, locked `FOR UPDATE SKIP LOCKED` on PostgreSQL, so that concurrent placements on
several replicas take other candidates instead of waiting on each other; only when every
fitting host is locked does a placement wait for them, so "no capacity" is never the answer
while capacity is merely busy (SQLite: the write transaction is the lock). Of those, the best
is the one that has the image already built (no build before the sandbox starts), then the
most free slots, then the most free memory. Its `used_*` grow by the request before the
transaction commits, so capacity is never promised twice. A lost, draining or silent host is
never a candidate: the state and the heartbeat are in the same statement that locks the rows.

`release` gives a reservation back — only to the same life (epoch) of the host that got it:
a host that registered again starts from nothing reserved.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from aamp.errors import AampError
from aamp.fleet.registry import HostRegistry
from aamp.store import time_at
from aamp.store.tables import HostRow

DEFAULT_CANDIDATES = 3


class NoCapacity(AampError, code="no_capacity", status=503):
    """No active host can take the sandbox now; the message says what was asked."""


@dataclass(frozen=True)
class Need:
    """What one sandbox takes of a host."""

    driver: str
    image: str  # an image name
    cpus: float
    memory_mb: int

    @property
    def millicpus(self) -> int:
        return math.ceil(self.cpus * 1000)


@dataclass(frozen=True)
class Placed:
    """Where a sandbox goes: the host and the life (epoch) of it that holds the reservation."""

    host_id: str
    epoch: int
    had_image: bool


def _has_image(row: HostRow, image: str) -> bool:
    return any(i.split("@", 1)[0] == image for i in json.loads(row.images))


class Placement:
    def __init__(self, registry: HostRegistry, k: int = DEFAULT_CANDIDATES) -> None:
        if k < 1:
            raise ValueError("placement needs at least one candidate")
        self.registry = registry
        self.k = k

    def place(self, need: Need, among: tuple[str, ...] | None = None) -> Placed:
        """(Blocking.) Reserve `need` on the best of up to `k` candidate hosts — of `among`
        only, if given: the hosts the caller can reach."""
        registry = self.registry
        fresh = time_at(registry.clock() - registry.lost_after)
        free_slots = HostRow.sandboxes - HostRow.used_sandboxes
        fits = select(HostRow).where(
            HostRow.id.in_(among) if among is not None else HostRow.id.is_not(None),
            HostRow.state == "active",
            HostRow.heartbeat_at >= fresh,
            HostRow.drivers.contains(json.dumps(need.driver)),
            HostRow.millicpus - HostRow.used_millicpus >= need.millicpus,
            HostRow.memory_mb - HostRow.used_memory_mb >= need.memory_mb,
            free_slots >= 1,
        )
        with registry.store.write_session() as s:
            rows = s.scalars(
                fits.order_by(free_slots.desc(), HostRow.id)
                .limit(self.k)
                .with_for_update(skip_locked=True)
            ).all()
            if not rows:
                # Every fitting host may be locked by placements in flight, not full: wait
                # for them and judge each host again as they leave it — locking in id order,
                # as every waiting placement does, so that no two wait on each other.
                rows = s.scalars(fits.order_by(HostRow.id).limit(self.k).with_for_update()).all()
            if not rows:
                where = f" of {', '.join(among)}" if among is not None else ""
                raise NoCapacity(
                    f"no active host{where} has a free slot with {need.cpus:g} cpus, "
                    f"{need.memory_mb} MiB and the {need.driver} driver"
                )
            best = max(
                rows,
                key=lambda r: (
                    _has_image(r, need.image),
                    r.sandboxes - r.used_sandboxes,
                    r.memory_mb - r.used_memory_mb,
                ),
            )
            best.used_millicpus += need.millicpus
            best.used_memory_mb += need.memory_mb
            best.used_sandboxes += 1
            return Placed(best.id, best.epoch, _has_image(best, need.image))

    def release(self, placed: Placed, need: Need) -> bool:
        """(Blocking.) Give a reservation back; False if the host has since begun a new
        life (or is gone), whose reservations started from nothing."""
        with self.registry.store.write_session() as s:
            return give_back(s, placed.host_id, placed.epoch, need.millicpus, need.memory_mb)


def give_back(s: Session, host_id: str, epoch: int, millicpus: int, memory_mb: int) -> bool:
    """In transaction `s`: one sandbox's reservation back to its host, if the host is still
    in the life (`epoch`) that reserved it; False if not."""
    row = s.get(HostRow, host_id, with_for_update=True)
    if row is None or row.epoch != epoch:
        return False
    row.used_millicpus = max(0, row.used_millicpus - millicpus)
    row.used_memory_mb = max(0, row.used_memory_mb - memory_mb)
    row.used_sandboxes = max(0, row.used_sandboxes - 1)
    return True
