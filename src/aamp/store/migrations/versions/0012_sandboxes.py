"""Sandboxes placed on fleet hosts (`aamp.fleet.sandboxes`): each one's host and host epoch,
its state (`live`, or `lost` with its host) and what it reserved of the host's capacity.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from aamp.store.migrations.shapes import at, check, create_index, drop_index, primary_key

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    op.create_table(
        "sandboxes",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("host_id", sa.String(64), nullable=False),
        sa.Column("host_epoch", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("millicpus", sa.Integer(), nullable=False),
        sa.Column("memory_mb", sa.Integer(), nullable=False),
        at("created_at"),
        sa.Column("lost_reason", sa.Text(), nullable=True),
        check("sandboxes", "state", "state IN ('live', 'lost')"),
        primary_key("sandboxes", "id"),
    )
    create_index("sandboxes", "host_id")


def downgrade() -> None:
    drop_index("sandboxes", "host_id")
    op.drop_table("sandboxes")
