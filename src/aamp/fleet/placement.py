"""`Placement`: choose the host a new sandbox runs on and reserve its capacity, in one
statement that is its own transaction.

The candidates are at most `k` hosts that are `active`, heartbeat within the lost timeout,
offer the driver, and have the cpus, memory and a sandbox slot free — the ones with the most
free slots, locked `FOR UPDATE SKIP LOCKED` on PostgreSQL, so that concurrent placements on
several replicas take other candidates instead of waiting on each other; only when every
fitting host is locked does a placement wait for them, so "no capacity" is never the answer
while capacity is merely busy (SQLite: the write transaction is the lock). Of those, the
best is the one that has the packages layer the sandbox needs already built (`Need.layer`),
then the one with the image (no build before the sandbox starts), then the most free slots,
then the most free memory. One `UPDATE ... WHERE id = (that choice) RETURNING` grows its
`used_*` by the request while the candidates are locked, so capacity is never promised
twice; on PostgreSQL it runs in autocommit — one round trip, where the choice read into
Python and written back took BEGIN, SELECT, UPDATE and COMMIT (the profile in
docs/deployment.md). A lost, draining or silent host is never a candidate: the state and the
heartbeat are in the statement that locks the rows.

`release` gives a reservation back — only to the same life (epoch) of the host that got it:
a host that registered again starts from nothing reserved.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Connection, Update, case, select, update
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
    # `IMAGE+PACKAGES_KEY` of its packages layer (`packages_key`), if it has packages: a
    # host that reports that layer built is preferred even to one with the image only.
    layer: str | None = None

    @property
    def millicpus(self) -> int:
        return math.ceil(self.cpus * 1000)


@dataclass(frozen=True)
class Placed:
    """Where a sandbox goes: the host and the life (epoch) of it that holds the reservation."""

    host_id: str
    epoch: int
    had_image: bool


def _has_image(images: str, image: str) -> bool:
    return any(i.split("@", 1)[0] == image for i in json.loads(images))


def _like_image(image: str) -> str:
    """A LIKE pattern for `"IMAGE@` in a host's JSON list of `name@hash` (`_has_image`)."""
    escaped = image.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f'%"{escaped}@%'


class Placement:
    def __init__(self, registry: HostRegistry, k: int = DEFAULT_CANDIDATES) -> None:
        if k < 1:
            raise ValueError("placement needs at least one candidate")
        self.registry = registry
        self.k = k

    def _reserve(self, need: Need, among: tuple[str, ...] | None, *, wait: bool) -> Update:
        """The one statement that chooses the best of up to `k` fitting hosts, locked, and
        reserves `need` on it, returning its id, epoch and images (no row: none fits)."""
        registry = self.registry
        fresh = time_at(registry.clock() - registry.lost_after)
        free_slots = HostRow.sandboxes - HostRow.used_sandboxes
        free_memory = HostRow.memory_mb - HostRow.used_memory_mb
        fits = (
            HostRow.id.in_(among) if among is not None else HostRow.id.is_not(None),
            HostRow.state == "active",
            HostRow.heartbeat_at >= fresh,
            HostRow.drivers.contains(json.dumps(need.driver)),
            HostRow.millicpus - HostRow.used_millicpus >= need.millicpus,
            free_memory >= need.memory_mb,
            free_slots >= 1,
        )
        has = [(HostRow.images.like(_like_image(need.image), escape="\\"), 1)]
        if need.layer is not None:
            has.insert(0, (HostRow.images.like(_like_image(need.layer), escape="\\"), 2))
        candidates = select(
            HostRow.id,
            case(*has, else_=0).label("has_image"),
            free_slots.label("free_slots"),
            free_memory.label("free_memory"),
        ).where(*fits)
        if wait:
            # Every fitting host may be locked by placements in flight, not full: wait for
            # them and judge each host again as they leave it (READ COMMITTED re-checks a
            # row locked after it changed) — locking in id order, as every waiting placement
            # does, so that no two wait on each other.
            candidates = candidates.order_by(HostRow.id).limit(self.k).with_for_update()
        else:
            candidates = (
                candidates.order_by(free_slots.desc(), HostRow.id)
                .limit(self.k)
                .with_for_update(skip_locked=True)
            )
        c = candidates.subquery()
        best = (
            select(c.c.id)
            .order_by(c.c.has_image.desc(), c.c.free_slots.desc(), c.c.free_memory.desc(), c.c.id)
            .limit(1)
            .scalar_subquery()
        )
        return (
            update(HostRow)
            .where(HostRow.id == best, *fits)
            .values(
                used_millicpus=HostRow.used_millicpus + need.millicpus,
                used_memory_mb=HostRow.used_memory_mb + need.memory_mb,
                used_sandboxes=HostRow.used_sandboxes + 1,
            )
            .returning(HostRow.id, HostRow.epoch, HostRow.images)
        )

    def place(self, need: Need, among: tuple[str, ...] | None = None) -> Placed:
        """(Blocking.) Reserve `need` on the best of up to `k` candidate hosts — of `among`
        only, if given: the hosts the caller can reach."""
        with self.registry.store.one_write() as conn:
            row = conn.execute(self._reserve(need, among, wait=False)).first()
        if row is None:
            with self.registry.store.one_write() as conn:
                row = conn.execute(self._reserve(need, among, wait=True)).first()
        if row is None:
            where = f" of {', '.join(among)}" if among is not None else ""
            raise NoCapacity(
                f"no active host{where} has a free slot with {need.cpus:g} cpus, "
                f"{need.memory_mb} MiB and the {need.driver} driver"
            )
        return Placed(row.id, row.epoch, _has_image(row.images, need.image))

    def release(self, placed: Placed, need: Need) -> bool:
        """(Blocking.) Give a reservation back; False if the host has since begun a new
        life (or is gone), whose reservations started from nothing."""
        with self.registry.store.one_write() as conn:
            return give_back(conn, placed.host_id, placed.epoch, need.millicpus, need.memory_mb)


def give_back(
    s: Session | Connection, host_id: str, epoch: int, millicpus: int, memory_mb: int
) -> bool:
    """In transaction `s`: one sandbox's reservation back to its host, if the host is still
    in the life (`epoch`) that reserved it; False if not. One statement (it locks the row)."""

    def less(column: ColumnElement[int], by: int) -> ColumnElement[int]:
        return case((column > by, column - by), else_=0)

    done = s.execute(
        update(HostRow)
        .where(HostRow.id == host_id, HostRow.epoch == epoch)
        .values(
            used_millicpus=less(HostRow.used_millicpus, millicpus),
            used_memory_mb=less(HostRow.used_memory_mb, memory_mb),
            used_sandboxes=less(HostRow.used_sandboxes, 1),
        )
        .execution_options(synchronize_session=False)
    )
    return bool(done.rowcount)  # type: ignore[attr-defined]
