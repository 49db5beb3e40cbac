"""`verify(store, keys)`: walk the whole chain in the database, streaming, first problem wins.

Records are read in pages by seq (keyset pagination: `WHERE seq > last ORDER BY seq LIMIT n`),
so memory stays flat however long the chain is, and appends that happen meanwhile do not
disturb the walk: it stops at the head read when it started.
"""

from __future__ import annotations

import time as _time
from collections.abc import Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import select

from aamp.audit.chain import ChainChecker, Checkpoint, Problem, VerifyReport
from aamp.store import Store
from aamp.store.tables import AuditCheckpointRow, AuditHeadRow, AuditRecordRow

PAGE_SIZE = 20_000

_r = AuditRecordRow.__table__.c
_COLUMNS = (
    _r.seq,
    _r.time,
    _r.actor,
    _r.action,
    _r.resource,
    _r.decision,
    _r.reason,
    _r.request_id,
    _r.details,
    _r.prev_hash,
    _r.hash,
)


def _page_sql(paramstyle: str) -> str:
    mark = "?" if paramstyle == "qmark" else "%s"
    names = ", ".join(column.name for column in _COLUMNS)
    return f"SELECT {names} FROM audit_records WHERE seq > {mark} ORDER BY seq LIMIT {mark}"


def load_checkpoints(store: Store) -> dict[int, Checkpoint]:
    c = AuditCheckpointRow.__table__.c
    with store.engine.connect() as conn:
        rows = conn.execute(select(c.seq, c.hash, c.key_id, c.signature)).all()
    return {int(r[0]): Checkpoint(int(r[0]), r[1], r[2], r[3]) for r in rows}


def verify(
    store: Store, trusted_keys: Mapping[str, Ed25519PublicKey], *, page_size: int = PAGE_SIZE
) -> VerifyReport:
    """Check every record, every link and every checkpoint signature; report the first fault."""
    started = _time.perf_counter()
    h = AuditHeadRow.__table__.c
    with store.engine.connect() as conn:
        head_seq = int(conn.execute(select(h.seq).where(h.id == 1)).scalar_one())
    checkpoints = load_checkpoints(store)
    checker = ChainChecker(checkpoints, trusted_keys)
    problem: Problem | None = None
    last = 0
    with store.engine.connect() as conn:
        # Pages go straight through the driver's cursor: plain tuples, no SQLAlchemy rows.
        sql = _page_sql(conn.dialect.paramstyle)
        driver = conn.connection.driver_connection
        assert driver is not None
        while problem is None:
            cursor = driver.cursor()
            try:
                cursor.execute(sql, (last, page_size))
                rows = cursor.fetchall()
            finally:
                cursor.close()
            driver.rollback()  # end the read transaction between pages (no long snapshot)
            if not rows:
                break
            if rows[-1][0] > head_seq:  # appended after we started
                rows = [row for row in rows if row[0] <= head_seq]
                problem = checker.feed_many(rows)
                break
            problem = checker.feed_many(rows)
            last = rows[-1][0]
    if problem is None:
        problem = checker.finish(expected_last_seq=head_seq)
    return VerifyReport(
        ok=problem is None,
        records=checker.records,
        checkpoints=checker.checkpoints_ok,
        first_seq=checker.first_seq,
        last_seq=checker.next_seq - 1 if checker.records else None,
        last_hash=checker.last_hash,
        problem=problem,
        seconds=_time.perf_counter() - started,
    )
