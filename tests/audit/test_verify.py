"""Tampering directly in the database is detected, naming the first bad record."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest
from audit_helpers import append_many
from sqlalchemy import Connection, text

from aamp.audit import AuditLog, Batching, CheckpointSigner, verify
from aamp.audit.canonical import encode
from aamp.store import Store

N = 30


@pytest.fixture
async def signed(store: Store) -> CheckpointSigner:
    signer = CheckpointSigner.generate()
    async with AuditLog(store, signer, batching=Batching(checkpoint_every=10)) as log:
        await append_many(log, N, tasks=4)
    report = verify(store, signer.trusted_keys())
    assert report.ok and report.records == N and report.checkpoints == 3, report.summary()
    return signer


def _tamper(store: Store, fn: Callable[[Connection], None]) -> None:
    with store.write_connection() as conn:
        fn(conn)


def _sql(*statements: str) -> Callable[[Connection], None]:
    def run(conn: Connection) -> None:
        for s in statements:
            conn.execute(text(s))

    return run


def _rehash(conn: Connection, seq: int) -> None:
    """What an attacker with database access does: recompute the edited record's hash."""
    row = conn.execute(
        text(
            "SELECT seq, time, actor, action, resource, decision, reason, request_id, details, "
            "prev_hash FROM audit_records WHERE seq = :s"
        ),
        {"s": seq},
    ).one()
    h = hashlib.sha256(encode(*row)).hexdigest()
    conn.execute(text("UPDATE audit_records SET hash = :h WHERE seq = :s"), {"h": h, "s": seq})


@pytest.mark.parametrize(
    ("tamper", "seq", "kind"),
    [
        (_sql("UPDATE audit_records SET actor = 'user:mallory' WHERE seq = 7"), 7, "edited"),
        (_sql("UPDATE audit_records SET decision = 'allow_all' WHERE seq = 3"), 3, "edited"),
        (_sql("UPDATE audit_records SET details = '{}' WHERE seq = 12"), 12, "edited"),
        (
            _sql("UPDATE audit_records SET time = '2020-01-01T00:00:00.000000Z' WHERE seq = 1"),
            1,
            "edited",
        ),
        (_sql("DELETE FROM audit_records WHERE seq = 15"), 15, "removed"),
        (_sql("DELETE FROM audit_records WHERE seq >= 29"), 29, "removed"),
        (
            _sql(
                "UPDATE audit_records SET seq = -1 WHERE seq = 8",
                "UPDATE audit_records SET seq = 8 WHERE seq = 9",
                "UPDATE audit_records SET seq = 9 WHERE seq = -1",
            ),
            8,
            "reordered",
        ),
        (
            _sql(
                "UPDATE audit_records SET seq = -1 WHERE seq = 4",
                "UPDATE audit_records SET seq = 4 WHERE seq = 20",
                "UPDATE audit_records SET seq = 20 WHERE seq = -1",
            ),
            4,
            "reordered",
        ),
    ],
    ids=["actor", "decision", "details", "time", "delete", "delete-tail", "swap", "swap-far"],
)
async def test_database_tampering_is_detected(
    store: Store,
    signed: CheckpointSigner,
    tamper: Callable[[Connection], None],
    seq: int,
    kind: str,
) -> None:
    _tamper(store, tamper)
    report = verify(store, signed.trusted_keys())
    assert not report.ok
    assert report.problem is not None
    assert (report.problem.seq, report.problem.kind) == (seq, kind), report.summary()
    assert f"record {seq}" in report.summary()


async def test_edit_with_recomputed_hash_breaks_the_next_link(
    store: Store, signed: CheckpointSigner
) -> None:
    def edit(conn: Connection) -> None:
        conn.execute(text("UPDATE audit_records SET actor = 'user:mallory' WHERE seq = 5"))
        _rehash(conn, 5)

    _tamper(store, edit)
    problem = verify(store, signed.trusted_keys()).problem
    assert problem is not None
    assert (problem.seq, problem.kind) == (6, "relinked")
    assert "record 5" in problem.message


async def test_rewriting_the_whole_tail_is_caught_by_the_signed_checkpoint(
    store: Store, signed: CheckpointSigner
) -> None:
    def rewrite(conn: Connection) -> None:
        conn.execute(text("UPDATE audit_records SET actor = 'user:mallory' WHERE seq = 5"))
        for seq in range(5, N + 1):
            prev = conn.execute(
                text("SELECT hash FROM audit_records WHERE seq = :s"), {"s": seq - 1}
            ).scalar_one()
            conn.execute(
                text("UPDATE audit_records SET prev_hash = :p WHERE seq = :s"),
                {"p": prev, "s": seq},
            )
            _rehash(conn, seq)
        last = conn.execute(text("SELECT hash FROM audit_records WHERE seq = :s"), {"s": N})
        conn.execute(text("UPDATE audit_head SET hash = :h"), {"h": last.scalar_one()})

    _tamper(store, rewrite)
    problem = verify(store, signed.trusted_keys()).problem
    assert problem is not None
    assert (problem.seq, problem.kind) == (10, "checkpoint")


async def test_truncation_hidden_by_moving_the_head_is_caught_by_a_checkpoint(
    store: Store, signed: CheckpointSigner
) -> None:
    def truncate(conn: Connection) -> None:
        conn.execute(text("DELETE FROM audit_records WHERE seq > 22"))
        h = conn.execute(text("SELECT hash FROM audit_records WHERE seq = 22")).scalar_one()
        conn.execute(text("UPDATE audit_head SET seq = 22, hash = :h"), {"h": h})

    _tamper(store, truncate)
    problem = verify(store, signed.trusted_keys()).problem
    assert problem is not None
    assert (problem.seq, problem.kind) == (23, "removed")
    assert "checkpoint covers record 30" in problem.message


async def test_forged_or_foreign_checkpoints_are_detected(
    store: Store, signed: CheckpointSigner
) -> None:
    _tamper(
        store, _sql("UPDATE audit_checkpoints SET signature = '" + "00" * 64 + "' WHERE seq = 20")
    )
    problem = verify(store, signed.trusted_keys()).problem
    assert problem is not None and (problem.seq, problem.kind) == (20, "checkpoint")
    assert "invalid signature" in problem.message

    other = CheckpointSigner.generate()
    problem = verify(store, other.trusted_keys()).problem
    assert problem is not None and (problem.seq, problem.kind) == (10, "checkpoint")
    assert "unknown key" in problem.message


async def test_empty_log_verifies(store: Store) -> None:
    report = verify(store, CheckpointSigner.generate().trusted_keys())
    assert report.ok and report.records == 0
