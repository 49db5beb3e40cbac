"""Audit log (records, head, checkpoints) and the secrets vault.

Identity, tokens and grants come in a later revision (0002_...), revising this one.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from aamp.store.migrations.shapes import (
    at,
    by,
    check,
    create_index,
    drop_index,
    primary_key,
    stamped,
)

revision = "0001"
down_revision = None

GENESIS_HASH = "0" * 64


def upgrade() -> None:
    op.create_table(
        "audit_records",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        at("time"),
        by("actor"),
        sa.Column("action", sa.String(128), nullable=False),
        sa.Column("resource", sa.String(512), nullable=False),
        sa.Column("decision", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("request_id", sa.String(128), nullable=True),
        sa.Column("details", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        primary_key("audit_records", "seq"),
    )
    for column in ("time", "actor", "resource"):
        create_index("audit_records", column)

    head = op.create_table(
        "audit_head",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        check("audit_head", "single_row", "id = 1"),
        primary_key("audit_head", "id"),
    )
    op.bulk_insert(head, [{"id": 1, "seq": 0, "hash": GENESIS_HASH}])

    op.create_table(
        "audit_checkpoints",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        at("time"),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("signature", sa.String(128), nullable=False),
        primary_key("audit_checkpoints", "seq"),
    )

    op.create_table(
        "secrets",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("value_nonce", sa.LargeBinary(), nullable=False),
        sa.Column("value_ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("key_nonce", sa.LargeBinary(), nullable=False),
        sa.Column("wrapped_key", sa.LargeBinary(), nullable=False),
        sa.Column("master_key_id", sa.String(32), nullable=False),
        *stamped(),
        primary_key("secrets", "name"),
    )


def downgrade() -> None:
    op.drop_table("secrets")
    op.drop_table("audit_checkpoints")
    op.drop_table("audit_head")
    for column in ("resource", "actor", "time"):
        drop_index("audit_records", column)
    op.drop_table("audit_records")
