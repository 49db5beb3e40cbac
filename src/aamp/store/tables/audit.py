"""Tables of the audit log (written only by `aamp.audit.log.AuditLog`).

- `audit_records`: the hash chain itself; `seq` is assigned by the single writer, contiguous
  from 1. `time` is the canonical RFC 3339 text (fixed width, so it also sorts and filters
  correctly as text); `details` is the canonical JSON text of the details object.
- `audit_head`: exactly one row (id = 1) holding the last seq and hash. Every writer locks it
  (`SELECT ... FOR UPDATE` / SQLite's write lock) before extending the chain, which serialises
  writers across processes; verify also compares the chain's end with it.
- `audit_checkpoints`: Ed25519 signatures over (seq, hash) at regular intervals. No foreign
  key to the records on purpose: a removed record must be *detected*, not prevented by a
  constraint an attacker with database access can drop anyway.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, CheckConstraint, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from aamp.store.tables.base import Base

HASH_HEX_LEN = 64


class AuditRecordRow(Base):
    __tablename__ = "audit_records"

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    time: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(256))
    action: Mapped[str] = mapped_column(String(128))
    resource: Mapped[str] = mapped_column(String(512))
    decision: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    request_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    details: Mapped[str] = mapped_column(Text)
    prev_hash: Mapped[str] = mapped_column(String(HASH_HEX_LEN))
    hash: Mapped[str] = mapped_column(String(HASH_HEX_LEN))

    # Each filter the log is read by, then the record number it is read in (migration 0006).
    __table_args__ = (
        Index("ix_audit_records_time", "time"),
        Index("ix_audit_records_actor_seq", "actor", "seq"),
        # Someone's denials (or allows): without it, every record of theirs is read past the
        # page start when none match.
        Index("ix_audit_records_actor_decision_seq", "actor", "decision", "seq"),
        Index("ix_audit_records_action_seq", "action", "seq"),
        Index("ix_audit_records_resource_seq", "resource", "seq"),
    )


class AuditHeadRow(Base):
    __tablename__ = "audit_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    seq: Mapped[int] = mapped_column(BigInteger)
    hash: Mapped[str] = mapped_column(String(HASH_HEX_LEN))

    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)


class AuditCheckpointRow(Base):
    __tablename__ = "audit_checkpoints"

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    hash: Mapped[str] = mapped_column(String(HASH_HEX_LEN))
    time: Mapped[str] = mapped_column(String(32))
    key_id: Mapped[str] = mapped_column(String(32))
    signature: Mapped[str] = mapped_column(String(128))
