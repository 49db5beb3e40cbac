"""`verify(store, keys, witness=...)`: walk the whole chain in the database, first problem wins.

Records are read in pages by seq (keyset pagination: `WHERE seq > last ORDER BY seq LIMIT n`),
each with the signed checkpoints of its range, so memory stays flat however long the chain
is, and appends that happen meanwhile do not disturb the walk: it stops at the head read when
it started. The head and the checkpoints past it are read in one statement (one snapshot),
so a checkpoint past the head is evidence of removed records, never a concurrent append.

With a witness (`witness.WitnessReader`, made before this call, so each of its lines was
written after its checkpoint committed and before the head is read): a chain that ends before
the newest line, or holds another record at a line's seq, fails, naming the missing range or
the record. So does a damaged or missing witness, and one that lacks a signed checkpoint the
database has held for over a minute (lines cut from its end, or a host process that stopped
before writing them: its next start writes the head).
"""

from __future__ import annotations

import time as _time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aamp.audit.chain import ChainChecker, Checkpoint, Problem, Row, VerifyReport
from aamp.audit.record import RECORD_COLUMNS
from aamp.audit.witness import WitnessReader
from aamp.store import Store
from aamp.store.timestamps import format_time

PAGE_SIZE = 20_000
WITNESS_LAG_GRACE = timedelta(seconds=60)  # far longer than a checkpoint takes to be witnessed

_RECORD_COLUMNS = ", ".join(RECORD_COLUMNS)
_CHECKPOINT_COLUMNS = "seq, hash, key_id, signature, time"
# One statement, one snapshot: the head, and every checkpoint past it (none, normally).
_HEAD_SQL = (
    "SELECT h.seq, c.seq, c.hash, c.key_id, c.signature, c.time FROM audit_head h "
    "LEFT JOIN audit_checkpoints c ON c.seq > h.seq WHERE h.id = 1"
)


def _sql(paramstyle: str) -> tuple[str, str, str]:
    """(records page, checkpoints in a range, newest checkpoint up to a seq) statements."""
    mark = "?" if paramstyle == "qmark" else "%s"
    return (
        f"SELECT {_RECORD_COLUMNS} FROM audit_records WHERE seq > {mark} ORDER BY seq LIMIT {mark}",
        f"SELECT {_CHECKPOINT_COLUMNS} FROM audit_checkpoints WHERE seq > {mark} AND seq <= {mark}",
        f"SELECT {_CHECKPOINT_COLUMNS} FROM audit_checkpoints WHERE seq <= {mark} "
        "ORDER BY seq DESC LIMIT 1",
    )


def _fetch(driver: Any, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    cursor = driver.cursor()
    try:
        cursor.execute(sql, params)
        return list(cursor.fetchall())
    finally:
        cursor.close()


def read_pages(
    store: Store, *, after: int = 0, upto: int | None = None, page_size: int = PAGE_SIZE
) -> Iterator[tuple[list[Row], dict[int, Checkpoint]]]:
    """Records with seq in (`after`, `upto`] in pages, each with its range's checkpoints.

    Pages go straight through the driver's cursor (plain tuples, no SQLAlchemy rows), and the
    read transaction ends between pages (no long snapshot).
    """
    with store.engine.connect() as conn:
        records_sql, checkpoints_sql, _ = _sql(conn.dialect.paramstyle)
        driver = conn.connection.driver_connection
        assert driver is not None
        while True:
            fetched = _fetch(driver, records_sql, (after, page_size))
            rows = fetched if upto is None else [r for r in fetched if r[0] <= upto]
            if not rows:
                driver.rollback()
                return
            found = _fetch(driver, checkpoints_sql, (after, rows[-1][0]))
            driver.rollback()
            yield rows, {int(r[0]): Checkpoint.of(r) for r in found}
            if len(rows) < page_size:
                return
            after = rows[-1][0]


def verify(
    store: Store,
    trusted_keys: Mapping[str, Ed25519PublicKey],
    *,
    witness: WitnessReader | None = None,
    page_size: int = PAGE_SIZE,
) -> VerifyReport:
    """Check every record, link and checkpoint signature (and the witness); the first fault."""
    started = _time.perf_counter()
    started_at = datetime.now(UTC)
    with store.engine.connect() as conn:
        head = conn.exec_driver_sql(_HEAD_SQL).all()
    head_seq = int(head[0][0])
    beyond = [Checkpoint.of(r[1:]) for r in head if r[1] is not None]
    checker = ChainChecker({}, trusted_keys, witness=() if witness is None else witness)
    problem: Problem | None = None
    for rows, checkpoints in read_pages(store, upto=head_seq, page_size=page_size):
        checker.checkpoints = checkpoints
        problem = checker.feed_many(rows)
        if problem is not None:
            break
    if problem is None:
        problem = checker.finish(expected_last_seq=head_seq, beyond=beyond)
    note = None
    if witness is not None:
        witness_problem = witness.problem(chain_has_records=checker.records > 0)
        if witness_problem is None and problem is None:
            witness_problem = _witness_lags(store, witness, head_seq, started_at)
        if problem is None:
            problem = witness_problem
        elif witness_problem is not None:
            note = f"also: {witness_problem.message}"
    return checker.report(problem, started=started, note=note, witnessed=witness is not None)


def _witness_lags(
    store: Store, witness: WitnessReader, head_seq: int, started_at: datetime
) -> Problem | None:
    """A signed checkpoint the witness should long have, but lacks (its end was cut)?"""
    with store.engine.connect() as conn:
        newest_sql = _sql(conn.dialect.paramstyle)[2]
        driver = conn.connection.driver_connection
        found = _fetch(driver, newest_sql, (head_seq,))
        driver.rollback()
    if not found:
        return None
    newest = Checkpoint.of(found[0])
    witnessed = witness.last
    if witnessed is not None and witnessed.seq >= newest.seq:
        return None
    if newest.time is None or newest.time >= format_time(started_at - WITNESS_LAG_GRACE):
        return None  # recent: being written now, or the host just stopped
    ends = "holds no line" if witnessed is None else f"ends at record {witnessed.seq}"
    return Problem(
        None,
        "witness_damaged",
        f"the witness file {witness.path} {ends}, but the database has held a signed "
        f"checkpoint at record {newest.seq} since {newest.time}: lines were cut from the end "
        "of the witness, or the host process stopped before writing them (it writes the head "
        "when it starts again)",
    )


def verify_installation(store: Store, home: Path, witness_path: Path | None = None) -> VerifyReport:
    """`verify` with the installation's own trusted keys (`$AAMP_HOME`'s signing key) and its
    witness (or the copy at `witness_path`), as `aamp audit verify` and the UI run it."""
    from aamp.audit.signing import SIGNING_KEY_FILENAME, CheckpointSigner
    from aamp.audit.witness import WITNESS_FILENAME

    key_path = home / SIGNING_KEY_FILENAME
    keys = CheckpointSigner.load(key_path).trusted_keys() if key_path.exists() else {}
    # Made before the chain's head is read: every line it holds is then in the chain.
    witness = WitnessReader(witness_path or home / WITNESS_FILENAME, keys)
    return verify(store, keys, witness=witness)
