"""Sandboxes placed on fleet hosts (`aamp.fleet.sandboxes`): each one's host and host epoch,
its state (`live`, or `lost` with its host) and what it reserved of the host's capacity.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sandboxes",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("host_id", sa.String(64), nullable=False),
        sa.Column("host_epoch", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("millicpus", sa.Integer(), nullable=False),
        sa.Column("memory_mb", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("lost_reason", sa.Text(), nullable=True),
        sa.CheckConstraint("state IN ('live', 'lost')", name=op.f("ck_sandboxes_state")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sandboxes")),
    )
    op.create_index("ix_sandboxes_host_id", "sandboxes", ["host_id"])


def downgrade() -> None:
    op.drop_index("ix_sandboxes_host_id", table_name="sandboxes")
    op.drop_table("sandboxes")
