"""Sandbox hosts: registration, epochs, capacity, images and heartbeats (`aamp.fleet`)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from aamp.store.migrations.shapes import at, check, created, primary_key

revision = "0008"
down_revision = "0007"


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
        at("heartbeat_at", nullable=True),
        *created(),
        check("hosts", "state", "state IN ('new', 'active', 'draining', 'lost')"),
        primary_key("hosts", "id"),
    )


def downgrade() -> None:
    op.drop_table("hosts")
