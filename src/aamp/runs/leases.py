"""`RunLeases`: which control-plane replica drives each unfinished run, as a lease in the
run's row that its owner renews and any replica may take over once it has expired.

A replica (`replica`: an id made afresh at each process start) takes the lease of a run it
starts (`take`), renews every lease it holds well within `seconds` (`renew`, which also says
which runs it no longer holds — taken over while it stalled: it must stop driving them), and
gives a run's lease up when the run ends (`release`). A replica that dies stops renewing;
`claim_expired` then hands one of its unfinished runs to whichever replica asks first:
`SELECT … FOR UPDATE SKIP LOCKED` on PostgreSQL, so replicas asking at once each get a
different run and none waits on another. A run with no lease at all (made before leases, or
by a process that died before it took one) counts as expired once it is older than a lease.

Fencing: every take or takeover makes the run's `lease_epoch` one more, and this replica
keeps the epoch of each lease it holds (`fence`). The driver's writes of a run (its steps,
its status) name that fence, and `RunStore` refuses them (`LeaseLost`) unless the run's row
still says this replica and this epoch — so a replica that stalled past its lease, and then
woke up, cannot write a step or an ending into a run another replica now drives.

What the claimer then does with the run (continue it from its step log, or fail it with the
reason) is the run service's; this module only decides who drives it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

from sqlalchemy import ColumnElement, and_, or_, select, update

from aamp.errors import Conflict
from aamp.runs.bus import LEASE, announce
from aamp.store import Store, time_at
from aamp.store.tables import RunRow

ACTIVE = ("queued", "running", "waiting_approval")
DEFAULT_LEASE_SECONDS = 15.0


@dataclass(frozen=True)
class Fence:
    """A lease as its holder names it in a write: the replica and the lease's epoch."""

    replica: str
    epoch: int
    # This replica already knows another one took the run over (its renewal said so): a
    # write is refused before anything of it is done, even its audit record.
    lost: bool = field(default=False, compare=False)

    def holds(self) -> ColumnElement[bool]:
        """The condition a run's row meets while this lease is still the run's."""
        return and_(RunRow.lease_owner == self.replica, RunRow.lease_epoch == self.epoch)


class LeaseLost(Conflict):
    """A write of a run's driver after another replica took the run over; nothing changed."""


@dataclass(eq=False)
class RunLeases:
    store: Store
    replica: str
    _: KW_ONLY
    seconds: float = DEFAULT_LEASE_SECONDS
    clock: Callable[[], float] = time.time
    # The epoch of each lease this replica took (run id -> epoch), until it releases it —
    # also once lost: its writes must go on naming the stale epoch, and so be refused.
    _held: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _lost: set[str] = field(default_factory=set, init=False, repr=False)

    def _at(self, offset: float = 0.0) -> str:
        return time_at(self.clock() + offset)

    def fence(self, run_id: str) -> Fence | None:
        """The lease this replica took on `run_id`, for its writes — a lost one too, so that
        they are refused; None if it took none (or released it)."""
        epoch = self._held.get(run_id)
        return None if epoch is None else Fence(self.replica, epoch, run_id in self._lost)

    def held(self) -> set[str]:
        """The runs whose lease this replica holds, as far as it knows (not those lost)."""
        return set(self._held) - self._lost

    def take(self, run_id: str) -> None:
        """(Blocking.) This replica drives `run_id` (a run it has just created)."""
        with self.store.write_session() as s:
            row = s.scalars(select(RunRow).where(RunRow.id == run_id).with_for_update()).first()
            if row is None:
                return
            row.lease_owner = self.replica
            row.lease_until = self._at(self.seconds)
            row.lease_epoch = (row.lease_epoch or 0) + 1
            epoch = row.lease_epoch
        self._held[run_id] = epoch
        self._lost.discard(run_id)

    def renew(self, run_ids: set[str]) -> set[str]:
        """(Blocking.) Extend the leases of the runs this replica drives; returns those of
        `run_ids` it no longer holds: another replica took them over (or they are gone).

        A run that ended under this replica's lease is neither renewed nor lost: its driver
        is storing its last steps (`run.finished` comes just after the ending's status), and
        must not be stopped, nor its writes refused, half-way."""
        if not run_ids:
            return set()
        with self.store.write_session() as s:
            rows = s.execute(
                select(RunRow.id, RunRow.lease_owner, RunRow.lease_epoch, RunRow.status)
                .where(RunRow.id.in_(run_ids))
                .with_for_update()
            ).all()
            # Held still, and by the epoch this replica took (not a later take of its own).
            mine = {
                r.id
                for r in rows
                if r.lease_owner == self.replica
                and self._held.get(r.id, r.lease_epoch) == r.lease_epoch
            }
            active = {r.id for r in rows if r.id in mine and r.status in ACTIVE}
            if active:
                s.execute(
                    update(RunRow)
                    .where(RunRow.id.in_(active))
                    .values(lease_until=self._at(self.seconds))
                )
        lost = run_ids - mine
        self._lost |= lost & set(self._held)
        return lost

    def claim_expired(self, *, any_age: bool = False) -> tuple[str, str | None] | None:
        """(Blocking.) Take over one unfinished run whose lease expired: its id and the
        replica that held it (None if it had no lease); None if there is none.

        `any_age`: every unfinished run is claimable, expired or not — only for a store that
        one process alone can use (SQLite under the installation lock), where every run
        unfinished at start-up is a dead process's."""
        expired = or_(
            RunRow.lease_until < self._at(),
            # No lease yet: claimable once it is older than a lease, so a run
            # between its creation and its starter's `take` is never claimed.
            and_(
                RunRow.lease_until.is_(None),
                RunRow.created_at < self._at(-self.seconds),
            ),
        )
        # Not taken already by this very process (a run it started after start-up).
        not_mine = or_(RunRow.lease_owner.is_(None), RunRow.lease_owner != self.replica)
        with self.store.write_session() as s:
            row = s.scalars(
                select(RunRow)
                .where(RunRow.status.in_(ACTIVE), not_mine if any_age else expired)
                .order_by(RunRow.lease_until, RunRow.id)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if row is None:
                return None
            previous = row.lease_owner
            row.lease_owner = self.replica
            row.lease_until = self._at(self.seconds)
            row.lease_epoch = (row.lease_epoch or 0) + 1
            run_id, epoch = row.id, row.lease_epoch
        self._held[run_id] = epoch
        self._lost.discard(run_id)
        return run_id, previous

    def hand_off(self, run_id: str) -> None:
        """(Blocking.) This replica stops driving an unfinished run (it shuts down): its lease
        expires now, so the next replica to sweep takes the run over — woken at once
        (`aamp.runs.bus.LEASE`). The lease still names this replica, for the taker's record."""
        fence = self._let_go(run_id)
        if fence is None:
            return
        with self.store.write_session() as s:
            changed = s.execute(
                update(RunRow)
                .where(RunRow.id == run_id, fence.holds(), RunRow.status.in_(ACTIVE))
                .values(lease_until=self._at(-1.0))
            )
            if changed.rowcount:  # type: ignore[attr-defined]
                announce(s, LEASE, run_id)

    def release(self, run_id: str) -> None:
        """(Blocking.) The run ended here: nobody holds its lease any more."""
        fence = self._let_go(run_id)
        if fence is None:
            return
        with self.store.write_session() as s:
            s.execute(
                update(RunRow)
                .where(RunRow.id == run_id, fence.holds())
                .values(lease_owner=None, lease_until=None)
            )

    def _let_go(self, run_id: str) -> Fence | None:
        """Forget the lease this replica took on `run_id`; returns it (None: it took none)."""
        fence = self.fence(run_id)
        self._held.pop(run_id, None)
        self._lost.discard(run_id)
        return fence
