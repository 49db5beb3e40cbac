"""Appending: chained, contiguous, validated, group-committed, checkpointed, multi-writer."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from audit_helpers import append_many
from sqlalchemy import text

from aamp.audit import (
    AuditClosed,
    AuditInputError,
    AuditLog,
    AuditWriteError,
    Batching,
    CheckpointSigner,
    verify,
)
from aamp.audit.canonical import GENESIS_HASH, encode
from aamp.audit.signing import verify_signature
from aamp.config import Settings
from aamp.store import Store


def _count(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM audit_records")).scalar_one())


async def test_records_are_chained_from_genesis(settings: Settings, store: Store) -> None:
    async with AuditLog.open(settings, store) as log:
        recs = await append_many(log, 5)
    assert [r.seq for r in recs] == [1, 2, 3, 4, 5]
    prev = GENESIS_HASH
    for r in recs:
        assert r.prev_hash == prev
        assert (
            r.hash
            == hashlib.sha256(
                encode(
                    r.seq,
                    r.time,
                    r.actor,
                    r.action,
                    r.resource,
                    r.decision,
                    r.reason,
                    r.request_id,
                    r.details_json,
                    r.prev_hash,
                )
            ).hexdigest()
        )
        prev = r.hash
    assert recs[0].details == {"argv": ["python", "-c", "print(0)"], "exit": 0, "é": "ü"}
    key = settings.home / "audit-signing.key"
    assert key.stat().st_mode & 0o777 == 0o600


async def test_concurrent_appends_are_batched_into_one_chain(
    settings: Settings, store: Store
) -> None:
    batches: list[int] = []
    log = AuditLog.open(settings, store)
    original = log._commit_batch

    def spy(events):  # type: ignore[no-untyped-def]
        batches.append(len(events))
        return original(events)

    log._commit_batch = spy  # type: ignore[method-assign]
    async with log:
        recs = await append_many(log, 600, tasks=200)
    assert sorted(r.seq for r in recs) == list(range(1, 601))
    assert len({r.request_id for r in recs}) == 600
    assert max(batches) > 1, "concurrent appends were not group-committed"
    assert sum(batches) == 600
    report = verify(store, log.signer.trusted_keys())
    assert report.ok, report.summary()
    assert report.records == 600


async def test_bad_input_is_refused_and_nothing_written(settings: Settings, store: Store) -> None:
    async with AuditLog.open(settings, store) as log:
        good = {"actor": "user:a", "action": "x", "resource": "r:1", "decision": "allow"}
        cases = [
            ({**good, "actor": ""}, "'actor'"),
            ({**good, "action": "a\nb"}, "'action'"),
            ({**good, "decision": "Allow!"}, "'decision'"),
            ({**good, "details": {"x": float("inf")}}, "'details'"),
            ({**good, "details": {"x": object()}}, "'details'"),
            ({**good, "details": ["not", "a", "mapping"]}, "'details'"),
            ({**good, "request_id": "x" * 129}, "'request_id'"),
            ({**good, "resource": "\ud800"}, "'resource'"),
        ]
        for kwargs, field in cases:
            with pytest.raises(AuditInputError, match=field):
                await log.append(**kwargs)
        assert _count(store) == 0
        rec = await log.append(**good)
        assert rec.seq == 1


async def test_a_field_outside_the_record_or_one_missing_is_refused_by_name(
    settings: Settings, store: Store
) -> None:
    # The fields are `EventFields`' alone: a caller's stray or missing one is audit input
    # refused with its name, like a bad value, not a TypeError from a signature.
    async with AuditLog.open(settings, store) as log:
        good = {"actor": "user:a", "action": "x", "resource": "r:1", "decision": "allow"}
        with pytest.raises(AuditInputError, match="'secret_value' is not an audit field"):
            await log.append(**good, secret_value="s3cr3t")  # type: ignore[call-arg]
        for missing in good:
            fields = {k: v for k, v in good.items() if k != missing}
            with pytest.raises(AuditInputError, match=f"'{missing}'"):
                await log.append(**fields)  # type: ignore[misc]
        assert _count(store) == 0


async def test_checkpoints_every_n_and_at_close(settings: Settings, store: Store) -> None:
    signer = CheckpointSigner.load_or_create(settings.home / "audit-signing.key")
    async with AuditLog(store, signer, batching=Batching(checkpoint_every=10)) as log:
        await append_many(log, 25, tasks=5)
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.seq, c.hash, c.key_id, c.signature, r.hash FROM audit_checkpoints c "
                "JOIN audit_records r ON r.seq = c.seq ORDER BY c.seq"
            )
        ).all()
    assert [r[0] for r in rows] == [10, 20, 25]
    for seq, h, key_id, sig, record_hash in rows:
        assert h == record_hash
        assert key_id == signer.key_id
        assert verify_signature(signer.public_key, seq, h, sig)
    assert verify(store, signer.trusted_keys()).checkpoints == 3


async def test_the_same_key_is_used_on_the_next_start(settings: Settings, store: Store) -> None:
    first = AuditLog.open(settings, store).signer.key_id
    assert AuditLog.open(settings, store).signer.key_id == first


async def test_two_writers_on_one_database_extend_one_chain(
    settings: Settings, database_url: str
) -> None:
    """Two engines = two processes' worth of connections: the head lock serialises them."""
    signer = CheckpointSigner.generate()
    stores = [Store.from_url(database_url) for _ in range(2)]
    try:
        logs = [AuditLog(s, signer, batching=Batching(checkpoint_every=50)) for s in stores]
        for log in logs:
            await log.start()
        results = await asyncio.gather(
            *(append_many(log, 300, tasks=30, prefix=f"w{i}") for i, log in enumerate(logs))
        )
        for log in logs:
            await log.close()
        seqs = sorted(r.seq for recs in results for r in recs)
        assert seqs == list(range(1, 601))
        report = verify(stores[0], signer.trusted_keys())
        assert report.ok, report.summary()
        assert report.records == 600
    finally:
        for s in stores:
            s.close()


async def test_a_failed_commit_acknowledges_nothing(settings: Settings, store: Store) -> None:
    async with AuditLog.open(settings, store) as log:
        await append_many(log, 3)
        with store.write_connection() as conn:
            conn.execute(text("ALTER TABLE audit_records RENAME TO audit_records_away"))
        with pytest.raises(AuditWriteError, match="not committed"):
            await log.append(actor="user:a", action="x", resource="r:1", decision="allow")
        with store.write_connection() as conn:
            conn.execute(text("ALTER TABLE audit_records_away RENAME TO audit_records"))
        rec = await log.append(actor="user:a", action="y", resource="r:1", decision="allow")
        assert rec.seq == 4
    assert verify(store, log.signer.trusted_keys()).ok


async def test_append_after_close_is_refused(settings: Settings, store: Store) -> None:
    log = AuditLog.open(settings, store)
    with pytest.raises(AuditClosed):
        await log.append(actor="user:a", action="x", resource="r:1", decision="allow")
