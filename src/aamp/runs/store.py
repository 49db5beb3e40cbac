"""`RunStore`: the durable side of runs — their rows, their step log, artifacts, approvals.

Synchronous on purpose (called through `Store.run` in a worker thread, like the rest of the
store). Steps are numbered per run from 1 with no gaps; the caller numbers them
(`aamp.runs.steps.StepLog` keeps the next number of each live run, one writer per run) and the
primary key (run_id, seq) refuses a number given twice, so the SSE stream's Last-Event-ID is
simply the last number a client saw.

The writes of a run's driver (its steps, status, approvals' questions, artifacts) may name
the driver's lease (`fence`, `aamp.runs.leases.Fence`): they are then made only while the
run's row still names that lease, in the same transaction, and refused with `LeaseLost`
otherwise — nothing is written by a replica that another replica has fenced out.

A stored step, an approval answered and a cancel asked for are announced to the other
replicas in their own transaction (`aamp.runs.bus.announce`: PostgreSQL `NOTIFY`).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select, tuple_, update
from sqlalchemy.exc import IntegrityError

from aamp.errors import Conflict, NotFound
from aamp.runs.bus import APPROVAL, CANCEL, STEP, announce
from aamp.runs.leases import Fence, LeaseLost
from aamp.store import Store, existing, quick_read, value_of, values_where
from aamp.store.tables import (
    AuditRecordRow,
    RunApprovalRow,
    RunArtifactRow,
    RunEventRow,
    RunInputRow,
    RunRow,
)
from aamp.store.timestamps import now

ACTIVE = ("queued", "running", "waiting_approval")
FINAL = ("succeeded", "failed", "cancelled", "timed_out")

_EVENTS = RunEventRow.__table__
_RUNS = RunRow.__table__


@dataclass(frozen=True)
class RunInfo:
    id: str
    agent_id: str
    version: int
    owner: str
    task: str
    status: str
    reason: str | None
    answer: str | None
    sandbox_id: str | None
    steps: int
    prompt_tokens: int
    completion_tokens: int
    created_at: str
    started_at: str | None
    ended_at: str | None

    @property
    def finished(self) -> bool:
        return self.status in FINAL

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class RunEvent:
    seq: int
    type: str
    data: dict[str, Any]
    at: str


def _info(row: RunRow) -> RunInfo:
    return value_of(RunInfo, row)


def _check_fence(run: RunRow | None, run_id: str, fence: Fence | None) -> None:
    """Refuse a driver's write to a run whose lease another replica now holds."""
    if fence is None or run is None:
        return
    if run.lease_owner != fence.replica or run.lease_epoch != fence.epoch:
        raise LeaseLost(
            f"run {run_id} is driven by {run.lease_owner or 'no replica'} now "
            f"(lease {run.lease_epoch}); {fence.replica}'s lease {fence.epoch} ended"
        )


def _approval(row: RunApprovalRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "run_id": row.run_id,
        "kind": row.kind,
        "subject": json.loads(row.subject),
        "status": row.status,
        "requested_at": row.requested_at,
        "decided_at": row.decided_at,
        "decided_by": row.decided_by,
        "note": row.note,
    }


@dataclass(frozen=True)
class RunStore:
    store: Store

    # -- runs ------------------------------------------------------------------------------

    def create(
        self,
        agent_id: str,
        version: int,
        owner: str,
        task: str,
        inputs: tuple[tuple[str, bytes], ...] = (),
    ) -> RunInfo:
        """A queued run, and its input files kept (same transaction) until it ends."""
        with self.store.write_session() as s:
            row = RunRow(
                id=f"run-{secrets.token_hex(6)}",
                agent_id=agent_id,
                version=version,
                owner=owner,
                task=task,
                status="queued",
                steps=0,
                prompt_tokens=0,
                completion_tokens=0,
                created_at=now(),
            )
            s.add(row)
            s.flush()
            for position, (name, data) in enumerate(inputs):
                s.add(RunInputRow(run_id=row.id, position=position, name=name, data=data))
            return _info(row)

    def inputs(self, run_id: str) -> tuple[tuple[str, bytes], ...]:
        """The input files a run was started with, while it has not ended."""
        with self.store.session() as s:
            rows = s.scalars(
                select(RunInputRow)
                .where(RunInputRow.run_id == run_id)
                .order_by(RunInputRow.position)
            )
            return tuple((r.name, bytes(r.data)) for r in rows)

    def forget_inputs(self, run_id: str) -> None:
        with self.store.write_session() as s:
            s.execute(delete(RunInputRow).where(RunInputRow.run_id == run_id))

    @quick_read  # one primary-key read; the live stream makes it after every step
    def find(self, run_id: str) -> RunInfo | None:
        with self.store.session() as s:
            row = s.get(RunRow, run_id) if isinstance(run_id, str) else None
            return _info(row) if row is not None else None

    @quick_read
    def get(self, run_id: str) -> RunInfo:
        run = self.find(run_id)
        if run is None:
            raise NotFound(f"no run {run_id!r}")
        return run

    def list(
        self,
        *,
        owner: str | None = None,
        agent: str | None = None,
        status: str | None = None,
        before: str | None = None,
        limit: int = 200,
    ) -> list[RunInfo]:
        """Newest first; `before` (a run id) continues after that run, by (created_at, id)."""
        with self.store.session() as s:
            q = select(RunRow)
            if owner is not None:
                q = q.where(RunRow.owner == owner)
            if agent is not None:
                q = q.where(RunRow.agent_id == agent)
            if status is not None:
                q = q.where(RunRow.status == status)
            if before is not None:
                last = s.get(RunRow, before)
                if last is None:
                    raise NotFound(f"before: no run {before!r}")
                # A row-value comparison: both backends read it as a range of the
                # (..., created_at, id) indexes, where the OR form made them scan.
                q = q.where(tuple_(RunRow.created_at, RunRow.id) < tuple_(last.created_at, last.id))
            q = q.order_by(RunRow.created_at.desc(), RunRow.id.desc()).limit(limit)
            return [_info(r) for r in s.scalars(q)]

    def update(self, run_id: str, fence: Fence | None = None, **fields: Any) -> RunInfo:
        """Change a run's fields; a run that has ended keeps its ending (refused, not changed),
        and a fenced-out driver's change is refused (`LeaseLost`)."""
        with self.store.write_session() as s:
            if fence is not None:  # locked, so no takeover lands between check and write
                s.get(RunRow, run_id, with_for_update=True)
            row = existing(s, RunRow, run_id, f"no run {run_id!r}")
            _check_fence(row, run_id, fence)
            if row.status in FINAL and "status" in fields:
                raise Conflict(f"run {run_id} already ended ({row.status})")
            for key, value in fields.items():
                setattr(row, key, value)
            if fields.get("status") in FINAL:
                row.ended_at = now()
            s.flush()
            return _info(row)

    def request_cancel(self, run_id: str, by: str) -> RunInfo:
        """Ask whichever replica drives an unfinished run to cancel it (the first asker is
        kept); a run that ended is refused (`Conflict`)."""
        with self.store.write_session() as s:
            row = existing(s, RunRow, run_id, f"no run {run_id!r}")
            s.refresh(row, with_for_update=True)
            if row.status in FINAL:
                raise Conflict(f"run {run_id} already ended ({row.status})")
            if row.cancel_requested_by is None:
                row.cancel_requested_by = by
            announce(s, CANCEL, run_id)
            s.flush()
            return _info(row)

    def cancel_requests(self, run_ids: set[str]) -> dict[str, str]:
        """Of some runs, those someone asked to cancel, and who."""
        if not run_ids:
            return {}
        with self.store.session() as s:
            by = RunRow.cancel_requested_by
            return values_where(s, RunRow.id, by, run_ids, by.is_not(None))

    @quick_read  # one primary-key read; the live stream makes it when it has nothing new
    def settled(self, run_id: str) -> bool:
        """The run ended and its driver is done with it: its lease was given up (after its
        `run.finished` step was stored) or has expired (its driver died in between)."""
        with self.store.session() as s:
            row = s.get(RunRow, run_id)
            if row is None or row.status not in FINAL:
                return False
            return row.lease_owner is None or (row.lease_until or "") < now()

    def interrupted(self) -> list[RunInfo]:
        """Runs an earlier process left unfinished (it stopped or was killed)."""
        with self.store.session() as s:
            return [_info(r) for r in s.scalars(select(RunRow).where(RunRow.status.in_(ACTIVE)))]

    # -- the step log ----------------------------------------------------------------------

    @quick_read
    def last_seq(self, run_id: str) -> int:
        """The highest step number the run has used (0 if none): stored, or only audited.

        Steps are audited before they are stored, so a process killed between the two leaves
        the audit log one step ahead of the store; numbering on from the store alone would
        give that number twice in the audit log. A run's own steps are its audit records
        with the run as both actor and resource (indexed by resource)."""
        key = f"run:{run_id}"
        with self.store.session() as s:
            stored = s.scalar(select(func.max(RunEventRow.seq)).where(RunEventRow.run_id == run_id))
            newest_audited = s.scalar(
                select(AuditRecordRow.details)
                .where(AuditRecordRow.resource == key, AuditRecordRow.actor == key)
                .order_by(AuditRecordRow.seq.desc())
                .limit(1)
            )
        audited = json.loads(newest_audited).get("seq", 0) if newest_audited else 0
        return max(int(stored or 0), int(audited or 0))

    def append_event(
        self,
        run_id: str,
        seq: int,
        type_: str,
        data: dict[str, Any],
        counts: tuple[int, int, int] | None = None,
        fence: Fence | None = None,
    ) -> RunEvent:
        """Store step `seq` of a run and, with `counts` = (steps, prompt_tokens,
        completion_tokens), add those to the run's counters in the same transaction.

        One transaction of two Core statements: this runs for every step of every run, and
        through the ORM (plus a `max(seq)` read and a second transaction for the counters) it
        cost several times as much, most of it holding the GIL against the event loop. A `seq`
        already taken (or an unknown run) raises `Conflict` and changes nothing; so does a
        `fence` the run's row no longer names (`LeaseLost`), checked by the statement that
        locks the row, before the step is inserted.
        """
        at = now()
        text = json.dumps(data, separators=(",", ":"))
        try:
            with self.store.write_connection() as conn:
                if fence is not None or counts is not None:
                    added = counts or (0, 0, 0)
                    where = [_RUNS.c.id == run_id]
                    if fence is not None:
                        where += [
                            _RUNS.c.lease_owner == fence.replica,
                            _RUNS.c.lease_epoch == fence.epoch,
                        ]
                    changed = conn.execute(
                        update(_RUNS)
                        .where(*where)
                        .values(
                            steps=_RUNS.c.steps + added[0],
                            prompt_tokens=_RUNS.c.prompt_tokens + added[1],
                            completion_tokens=_RUNS.c.completion_tokens + added[2],
                        )
                    )
                    if fence is not None and changed.rowcount != 1:
                        _check_fence(
                            conn.execute(select(RunRow).where(RunRow.id == run_id)).first(),
                            run_id,
                            fence,
                        )
                        raise LeaseLost(f"run {run_id}: {fence.replica} holds no lease on it")
                conn.execute(
                    _EVENTS.insert().values(run_id=run_id, seq=seq, type=type_, data=text, at=at)
                )
                announce(conn, STEP, run_id)
        except IntegrityError as err:
            raise Conflict(f"step {seq} of run {run_id} refused by the store: {err.orig}") from None
        return RunEvent(seq, type_, data, at)

    def events_after(self, run_id: str, after: int, limit: int = 500) -> list[RunEvent]:
        with self.store.session() as s:
            rows = s.scalars(
                select(RunEventRow)
                .where(RunEventRow.run_id == run_id, RunEventRow.seq > after)
                .order_by(RunEventRow.seq)
                .limit(limit)
            )
            return [RunEvent(r.seq, r.type, json.loads(r.data), r.at) for r in rows]

    # -- artifacts -------------------------------------------------------------------------

    def add_artifact(
        self, run_id: str, name: str, size: int, sha256: str, fence: Fence | None = None
    ) -> dict[str, Any]:
        with self.store.write_session() as s:
            _check_fence(s.get(RunRow, run_id, with_for_update=fence is not None), run_id, fence)
            row = RunArtifactRow(
                run_id=run_id, name=name, size=size, sha256=sha256, created_at=now()
            )
            s.add(row)
            s.flush()
            return {"name": name, "size": size, "sha256": sha256, "created_at": row.created_at}

    def artifacts(self, run_id: str) -> list[dict[str, Any]]:
        with self.store.session() as s:
            rows = s.scalars(
                select(RunArtifactRow)
                .where(RunArtifactRow.run_id == run_id)
                .order_by(RunArtifactRow.name)
            )
            return [
                {"name": r.name, "size": r.size, "sha256": r.sha256, "created_at": r.created_at}
                for r in rows
            ]

    # -- approvals -------------------------------------------------------------------------

    def request_approval(
        self, run_id: str, kind: str, subject: dict[str, Any], fence: Fence | None = None
    ) -> dict[str, Any]:
        """Open a question; in the same transaction the run (unless it ended) is marked
        `waiting_approval`, so whoever sees the question sees the run waiting."""
        with self.store.write_session() as s:
            run = s.get(RunRow, run_id, with_for_update=fence is not None)
            _check_fence(run, run_id, fence)
            if run is not None and run.status not in FINAL:
                run.status = "waiting_approval"
            row = RunApprovalRow(
                id=f"ap-{secrets.token_hex(6)}",
                run_id=run_id,
                kind=kind,
                subject=json.dumps(subject),
                status="pending",
                requested_at=now(),
            )
            s.add(row)
            s.flush()
            return _approval(row)

    def get_approval(self, approval_id: str) -> dict[str, Any]:
        with self.store.session() as s:
            row = s.get(RunApprovalRow, approval_id) if isinstance(approval_id, str) else None
            if row is None:
                raise NotFound(f"no approval request {approval_id!r}")
            return _approval(row)

    def approvals(self, *, pending_only: bool, run_id: str | None = None) -> list[dict[str, Any]]:
        with self.store.session() as s:
            q = select(RunApprovalRow)
            if run_id is not None:
                q = q.where(RunApprovalRow.run_id == run_id)
            if pending_only:
                q = q.where(RunApprovalRow.status == "pending")
            return [_approval(r) for r in s.scalars(q.order_by(RunApprovalRow.requested_at))]

    def decide(
        self, approval_id: str, status: str, by: str, note: str | None = None
    ) -> dict[str, Any]:
        """Answer a pending request once; a second answer is refused."""
        with self.store.write_session() as s:
            row = existing(s, RunApprovalRow, approval_id, f"no approval request {approval_id!r}")
            s.refresh(row, with_for_update=True)  # two replicas answering at once: one wins
            if row.status != "pending":
                raise Conflict(f"approval {approval_id} was already answered ({row.status})")
            row.status, row.decided_at, row.decided_by, row.note = status, now(), by, note
            announce(s, APPROVAL, approval_id)
            s.flush()
            return _approval(row)

    def cancel_pending(self, run_id: str) -> None:
        with self.store.write_session() as s:
            s.execute(
                update(RunApprovalRow)
                .where(RunApprovalRow.run_id == run_id, RunApprovalRow.status == "pending")
                .values(status="cancelled", decided_at=now(), decided_by="system")
            )
