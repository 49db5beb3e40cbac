"""Sandbox hosts: registration, epochs, capacity, images and heartbeats (`aamp.fleet`).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    count = {"nullable": False, "server_default": "0"}
    op.create_table(
        "hosts",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("epoch", sa.Integer(), **count),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("drivers", sa.Text(), nullable=False, server_default="[]"),
        sa.Column("images", sa.Text(), nullable=False, server_default="[]"),
        *(
            sa.Column(name, sa.Integer(), **count)
            for name in (
                "millicpus",
                "memory_mb",
                "sandboxes",
                "used_millicpus",
                "used_memory_mb",
                "used_sandboxes",
            )
        ),
        sa.Column("heartbeat_at", sa.String(32), nullable=True),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("created_by", sa.String(256), nullable=False),
        sa.CheckConstraint(
            "state IN ('new', 'active', 'draining', 'lost')", name=op.f("ck_hosts_state")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hosts")),
    )


def downgrade() -> None:
    op.drop_table("hosts")
