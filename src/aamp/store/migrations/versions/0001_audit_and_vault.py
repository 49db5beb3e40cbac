"""Audit log (records, head, checkpoints) and the secrets vault.

Identity, tokens and grants come in a later revision (0002_...), revising this one.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

GENESIS_HASH = "0" * 64


def upgrade() -> None:
    op.create_table(
        "audit_records",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("time", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(256), nullable=False),
        sa.Column("action", sa.String(128), nullable=False),
        sa.Column("resource", sa.String(512), nullable=False),
        sa.Column("decision", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("request_id", sa.String(128), nullable=True),
        sa.Column("details", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_audit_records")),
    )
    op.create_index("ix_audit_records_time", "audit_records", ["time"])
    op.create_index("ix_audit_records_actor", "audit_records", ["actor"])
    op.create_index("ix_audit_records_resource", "audit_records", ["resource"])

    head = op.create_table(
        "audit_head",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_audit_head_single_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_head")),
    )
    op.bulk_insert(head, [{"id": 1, "seq": 0, "hash": GENESIS_HASH}])

    op.create_table(
        "audit_checkpoints",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("time", sa.String(32), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("signature", sa.String(128), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_audit_checkpoints")),
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
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("created_by", sa.String(256), nullable=False),
        sa.Column("updated_at", sa.String(32), nullable=False),
        sa.Column("updated_by", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_secrets")),
    )


def downgrade() -> None:
    op.drop_table("secrets")
    op.drop_table("audit_checkpoints")
    op.drop_table("audit_head")
    op.drop_index("ix_audit_records_resource", table_name="audit_records")
    op.drop_index("ix_audit_records_actor", table_name="audit_records")
    op.drop_index("ix_audit_records_time", table_name="audit_records")
    op.drop_table("audit_records")
