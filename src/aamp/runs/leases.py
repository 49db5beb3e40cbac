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

Not yet used by `RunService` (docs/deployment.md says how it will be): there, start-up
recovery still fails every unfinished run, which is right for one process on SQLite (the
installation lock makes every unfinished run a dead process's) and wrong for replicas.

What the claimer then does with the run (continue it from its step log, or fail it with the
reason) is the run service's; this module only decides who drives it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass

from sqlalchemy import and_, or_, select, update

from aamp.store import Store, time_at
from aamp.store.tables import RunRow

ACTIVE = ("queued", "running", "waiting_approval")
DEFAULT_LEASE_SECONDS = 15.0


@dataclass(eq=False)
class RunLeases:
    store: Store
    replica: str
    _: KW_ONLY
    seconds: float = DEFAULT_LEASE_SECONDS
    clock: Callable[[], float] = time.time

    def _at(self, offset: float = 0.0) -> str:
        return time_at(self.clock() + offset)

    def take(self, run_id: str) -> None:
        """(Blocking.) This replica drives `run_id` (a run it has just created)."""
        with self.store.write_session() as s:
            s.execute(
                update(RunRow)
                .where(RunRow.id == run_id)
                .values(lease_owner=self.replica, lease_until=self._at(self.seconds))
            )

    def renew(self, run_ids: set[str]) -> set[str]:
        """(Blocking.) Extend the leases of the runs this replica drives; returns those of
        `run_ids` it no longer holds (another replica took them over, or they ended)."""
        if not run_ids:
            return set()
        with self.store.write_session() as s:
            held = set(
                s.scalars(
                    select(RunRow.id)
                    .where(
                        RunRow.id.in_(run_ids),
                        RunRow.lease_owner == self.replica,
                        RunRow.status.in_(ACTIVE),
                    )
                    .with_for_update()
                )
            )
            if held:
                s.execute(
                    update(RunRow)
                    .where(RunRow.id.in_(held))
                    .values(lease_until=self._at(self.seconds))
                )
        return run_ids - held

    def claim_expired(self) -> tuple[str, str | None] | None:
        """(Blocking.) Take over one unfinished run whose lease expired: its id and the
        replica that held it (None if it had no lease); None if there is none."""
        with self.store.write_session() as s:
            row = s.scalars(
                select(RunRow)
                .where(
                    RunRow.status.in_(ACTIVE),
                    or_(
                        RunRow.lease_until < self._at(),
                        # No lease yet: claimable once it is older than a lease, so a run
                        # between its creation and its starter's `take` is never claimed.
                        and_(
                            RunRow.lease_until.is_(None),
                            RunRow.created_at < self._at(-self.seconds),
                        ),
                    ),
                )
                .order_by(RunRow.lease_until, RunRow.id)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if row is None:
                return None
            previous = row.lease_owner
            row.lease_owner = self.replica
            row.lease_until = self._at(self.seconds)
            return row.id, previous

    def release(self, run_id: str) -> None:
        """(Blocking.) The run ended here: nobody holds its lease any more."""
        with self.store.write_session() as s:
            s.execute(
                update(RunRow)
                .where(RunRow.id == run_id, RunRow.lease_owner == self.replica)
                .values(lease_owner=None, lease_until=None)
            )
