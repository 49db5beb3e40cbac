"""`AuditLog`: durable, hash-chained appends with group commit and signed checkpoints.

How an append becomes durable:

1. `append()` validates the event on the caller's side (errors name the field, nothing is
   written) and queues it with a future.
2. One writer task per process takes everything queued (up to `max_batch`) and hands the batch
   to its own database thread, which in ONE transaction locks the chain head (`SELECT ... FOR
   UPDATE` on `audit_head` on PostgreSQL; `BEGIN IMMEDIATE` on SQLite), numbers and hashes the
   records from that head, inserts them (SQLite: one prepared INSERT, executemany;
   PostgreSQL: COPY), moves the head, adds any due checkpoint, and commits (SQLite WAL with
   synchronous=FULL / PostgreSQL with synchronous_commit=on). The statements go straight to
   the driver, and few of them: each is a round trip and a hand-back of the GIL.
3. Only after COMMIT returns are the callers' futures resolved. A failed batch fails every
   append in it; nothing is acknowledged that is not committed.

While one batch commits, new appends queue up and form the next batch: throughput grows with
concurrency at the cost of one commit's latency. Because the head is read under the lock in
every batch, several processes on one PostgreSQL database extend one chain without forks.

Checkpoints: whenever a batch crosses a multiple of `checkpoint_every`, the record at that seq
gets an Ed25519-signed checkpoint in the same transaction. On a time basis, `checkpoint_seconds`
after the first record no checkpoint covers, the head is signed too (`checkpointer.py`), as it
is at start-up (the head an earlier process left unsigned, e.g. after `kill -9`) and at
`close()`. Every committed checkpoint is appended to the witness file (`witness.py`).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Unpack

from sqlalchemy import select

from aamp.audit.chain import Checkpoint
from aamp.audit.checkpointer import DEFAULT_SECONDS, Checkpointer, seconds_from_env
from aamp.audit.forward import forward_from_env
from aamp.audit.record import (
    RECORD_COLUMNS,
    AuditEvent,
    AuditRecord,
    EventFields,
    make_event,
)
from aamp.audit.signing import SIGNING_KEY_FILENAME, CheckpointSigner, verify_signature
from aamp.audit.witness import WITNESS_FILENAME, WitnessFile
from aamp.config import Settings
from aamp.store import Store
from aamp.store.tables import AuditCheckpointRow, AuditHeadRow
from aamp.store.timestamps import now

DEFAULT_CHECKPOINT_EVERY = 10_000
DEFAULT_MAX_BATCH = 5_000

log = logging.getLogger(__name__)
_head = AuditHeadRow.__table__
_checkpoints = AuditCheckpointRow.__table__


def _insert_sql(paramstyle: str) -> str:
    marks = ", ".join(["?" if paramstyle == "qmark" else "%s"] * len(RECORD_COLUMNS))
    return f"INSERT INTO audit_records ({', '.join(RECORD_COLUMNS)}) VALUES ({marks})"


_COPY_SQL = f"COPY audit_records ({', '.join(RECORD_COLUMNS)}) FROM STDIN"


def _checkpoint_sql(paramstyle: str) -> str:
    mark = "?" if paramstyle == "qmark" else "%s"
    return (
        "INSERT INTO audit_checkpoints (seq, hash, time, key_id, signature) "
        f"VALUES ({', '.join([mark] * 5)})"
    )


def _head_sql(dialect: str) -> str:
    lock = " FOR UPDATE" if dialect == "postgresql" else ""  # SQLite: BEGIN IMMEDIATE
    return "SELECT seq, hash FROM audit_head WHERE id = 1" + lock


def _move_head_sql(paramstyle: str) -> str:
    mark = "?" if paramstyle == "qmark" else "%s"
    return f"UPDATE audit_head SET seq = {mark}, hash = {mark} WHERE id = 1"


@dataclass(frozen=True)
class Batching:
    """How the writer batches and signs: at most `max_batch` records a commit, a checkpoint
    at every multiple of `checkpoint_every` and at least every `checkpoint_seconds`."""

    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY
    max_batch: int = DEFAULT_MAX_BATCH
    checkpoint_seconds: float = DEFAULT_SECONDS

    def __post_init__(self) -> None:
        if self.checkpoint_every < 1 or self.max_batch < 1 or self.checkpoint_seconds <= 0:
            raise ValueError("checkpoint_every, max_batch and checkpoint_seconds must be positive")


class AuditWriteError(RuntimeError):
    """The batch holding this record could not be committed; the record was NOT written."""


class AuditClosed(RuntimeError):
    """The audit log is closed (or was never started); nothing can be appended."""


_Pending = tuple[AuditEvent, "asyncio.Future[AuditRecord]"]


class AuditLog:
    """The audit log of one installation (implements `AuditSink`).

    Usage::

        audit = AuditLog.open(settings, store)
        await audit.start()
        rec = await audit.append(actor="user:alice", action="login", resource="user:alice",
                                 decision="allow")
        await audit.close()          # checkpoint at the head, stop the writer
    """

    def __init__(
        self,
        store: Store,
        signer: CheckpointSigner,
        *,
        batching: Batching = Batching(),
        witness: WitnessFile | None = None,
    ) -> None:
        self.store = store
        self.signer = signer
        self.batching = batching
        self.witness = witness
        self._queue: asyncio.Queue[_Pending | None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._witness_executor: ThreadPoolExecutor | None = None
        self._checkpointer: Checkpointer | None = None
        self._closing = False

    @classmethod
    def open(cls, settings: Settings, store: Store, **batching: Any) -> AuditLog:
        """The installation's log: the host signing key from `$AAMP_HOME/audit-signing.key`,
        the witness `$AAMP_HOME/audit-witness.jsonl` (forwarded as AAMP_AUDIT_WITNESS_FORWARD
        says) and the interval AAMP_AUDIT_CHECKPOINT_SECONDS; a bad setting is a ConfigError.
        `batching` are `Batching` fields that replace those.
        """
        witness_path = settings.home / WITNESS_FILENAME
        forward = forward_from_env(settings.env, witness_path)
        batching.setdefault("checkpoint_seconds", seconds_from_env(settings.env))
        signer = CheckpointSigner.load_or_create(settings.home / SIGNING_KEY_FILENAME)
        witness = WitnessFile(witness_path, forward)
        return cls(store, signer, batching=Batching(**batching), witness=witness)

    async def start(self) -> None:
        """Start the writer; first sign (and witness) the head an earlier process left."""
        if self._writer is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aamp-audit")
        self._witness_executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="aamp-audit-witness"
        )
        checkpointer = Checkpointer(
            self._sign_head, self._witness, seconds=self.batching.checkpoint_seconds
        )
        try:
            if self.witness is not None:
                await self._in_thread(self._witness_executor, self.witness.create)
            await checkpointer.sign_now()  # start-up recovery
        except BaseException:
            self._shutdown_executors()
            raise
        self._queue = asyncio.Queue()
        self._closing = False
        self._checkpointer = checkpointer
        checkpointer.start()
        self._writer = asyncio.create_task(self._write_loop(), name="aamp-audit-writer")

    async def __aenter__(self) -> AuditLog:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def append(self, **fields: Unpack[EventFields]) -> AuditRecord:
        """Append one record (`make_event` checks it first); returns it once it is committed
        durably."""
        event = make_event(fields)
        if self._queue is None or self._closing:
            raise AuditClosed("the audit log is not running; nothing was recorded")
        future: asyncio.Future[AuditRecord] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((event, future))
        # Not shielded: a caller that gives up stops waiting, but a queued record is still
        # written (it cannot be taken back once handed over, and the chain stays whole).
        return await future

    record = append  # the AuditSink name

    async def checkpoint(self) -> int | None:
        """Sign (and witness) a checkpoint at the current head now; its seq (None if empty)."""
        if self._checkpointer is None:
            raise AuditClosed("the audit log is not running")
        cp = await self._checkpointer.sign_now()
        return None if cp is None else cp.seq

    async def close(self) -> None:
        """Write everything queued, checkpoint and witness the head, stop the writer."""
        if self._writer is None or self._queue is None or self._checkpointer is None:
            return
        self._closing = True
        self._queue.put_nowait(None)
        await self._writer
        try:
            await self._checkpointer.stop()
            await self._checkpointer.sign_now()
        finally:
            self._shutdown_executors()
            self._writer = None
            self._queue = None
            self._checkpointer = None

    def _shutdown_executors(self) -> None:
        for executor in (self._executor, self._witness_executor):
            if executor is not None:
                executor.shutdown(wait=True)
        self._executor = None
        self._witness_executor = None

    async def _in_thread(self, executor: ThreadPoolExecutor | None, fn: Any, *args: Any) -> Any:
        if executor is None:
            raise AuditClosed("the audit log is not running")
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    async def _sign_head(self) -> Checkpoint | None:
        # On the writer's own thread, between two of its batches: it never contends with
        # them for the head lock, and a batch waits at most for this one small transaction.
        result: Checkpoint | None = await self._in_thread(self._executor, self._checkpoint_head)
        return result

    async def _witness(self, cp: Checkpoint) -> None:
        if self.witness is not None:
            await self._in_thread(self._witness_executor, self.witness.append, cp)

    async def _write_loop(self) -> None:
        assert self._queue is not None and self._checkpointer is not None
        queue = self._queue
        checkpointer = self._checkpointer
        loop = asyncio.get_running_loop()
        stop = False
        while not stop:
            first = await queue.get()
            if first is None:
                break
            batch = [first]
            while len(batch) < self.batching.max_batch and not queue.empty():
                item = queue.get_nowait()
                if item is None:
                    stop = True
                    break
                batch.append(item)
            events = [event for event, _ in batch]
            try:
                records, signed = await loop.run_in_executor(
                    self._executor, self._commit_batch, events
                )
            except Exception as exc:  # every append in the batch learns it was not written
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(
                            AuditWriteError(f"audit batch not committed: {type(exc).__name__}")
                        )
                continue
            for (_, fut), rec in zip(batch, records, strict=True):
                if not fut.done():
                    fut.set_result(rec)
            checkpointer.records_committed(signed)

    def _commit_batch(self, events: list[AuditEvent]) -> tuple[list[AuditRecord], list[Checkpoint]]:
        """One transaction: lock head, chain, insert, move head, checkpoint, commit.

        Returns the records and the checkpoints signed with them.

        Statements go straight to the driver. SQLite: lock, one prepared INSERT run for every
        record (executemany: three times faster here than one multi-row INSERT, which SQLite
        parses anew for every batch size), move the head, COMMIT. PostgreSQL: BEGIN with the
        head's `SELECT ... FOR UPDATE` in one pipeline, the records by COPY (faster than
        pipelined INSERTs, which the server executes one by one), the head's UPDATE, COMMIT.
        """
        if not events:
            return [], []
        with self.store.write_connection() as conn:
            if conn.dialect.name == "postgresql":
                return self._commit_pg(conn.connection.driver_connection, events)
            seq, prev = conn.exec_driver_sql(_head_sql("sqlite")).one()
            records = self._chain(events, seq, prev)
            rows = [rec.row() for rec in records]
            paramstyle = conn.dialect.paramstyle
            conn.exec_driver_sql(_insert_sql(paramstyle), rows)
            conn.exec_driver_sql(_move_head_sql(paramstyle), (records[-1].seq, records[-1].hash))
            due = self._due_checkpoints(records)
            if due:
                conn.exec_driver_sql(_checkpoint_sql(paramstyle), [_cp_row(c) for c in due])
        return records, due

    def _commit_pg(
        self, driver: Any, events: list[AuditEvent]
    ) -> tuple[list[AuditRecord], list[Checkpoint]]:
        """The PostgreSQL body of `_commit_batch`; its caller's transaction commits."""
        with driver.cursor() as cur:
            with driver.pipeline():
                cur.execute(_head_sql("postgresql"))
            seq, prev = cur.fetchone()
            records = self._chain(events, seq, prev)
            due = self._due_checkpoints(records)
            with cur.copy(_COPY_SQL) as copy:
                for rec in records:
                    copy.write_row(rec.row())
            with driver.pipeline():
                cur.execute(_move_head_sql("format"), (records[-1].seq, records[-1].hash))
                if due:
                    cur.executemany(_checkpoint_sql("format"), [_cp_row(c) for c in due])
        return records, due

    def _chain(self, events: list[AuditEvent], seq: int, prev: str) -> list[AuditRecord]:
        """The events as records numbered and hashed on from the head (seq, prev)."""
        time = now()
        records: list[AuditRecord] = []
        for ev in events:
            seq += 1
            records.append(AuditRecord.chained(seq, time, ev, prev))
            prev = records[-1].hash
        return records

    def _due_checkpoints(self, records: list[AuditRecord]) -> list[Checkpoint]:
        """Signed checkpoints for the records at multiples of `checkpoint_every`."""
        return [
            self._signed(rec.seq, rec.hash, rec.time)
            for rec in records
            if rec.seq % self.batching.checkpoint_every == 0
        ]

    def _signed(self, seq: int, hash_hex: str, time: str) -> Checkpoint:
        signature = self.signer.sign(seq, hash_hex)
        return Checkpoint(seq, hash_hex, self.signer.key_id, signature, time)

    def _checkpoint_head(self) -> Checkpoint | None:
        """The head's checkpoint: signed now in its own transaction, or the one it has."""
        c = _checkpoints.c
        with self.store.write_connection() as conn:
            seq, hash_hex = conn.execute(
                select(_head.c.seq, _head.c.hash).where(_head.c.id == 1).with_for_update()
            ).one()
            if seq == 0:
                return None
            row = conn.execute(
                select(c.seq, c.hash, c.key_id, c.signature, c.time).where(c.seq == seq)
            ).first()
            if row is None:
                cp = self._signed(int(seq), hash_hex, now())
                conn.exec_driver_sql(_checkpoint_sql(conn.dialect.paramstyle), _cp_row(cp))
                return cp
            existing = Checkpoint.of(row)
            if existing.hash == hash_hex and verify_signature(
                self.signer.public_key, existing.seq, existing.hash, existing.signature
            ):
                return existing
        # A row this key did not sign for this head (planted, or another host's key): leave it
        # for `verify` to report, and give the witness a checkpoint that is really signed.
        log.warning("the audit checkpoint row at record %d does not verify; not witnessed", seq)
        return self._signed(int(seq), hash_hex, now())


def _cp_row(cp: Checkpoint) -> tuple[Any, ...]:
    """A checkpoint's values in `_checkpoint_sql` order."""
    return (cp.seq, cp.hash, cp.time, cp.key_id, cp.signature)
