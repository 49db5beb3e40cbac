"""Failed logins as rows, so that every control-plane replica on one database throttles alike."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from aamp.store.migrations.shapes import at, create_index, drop_index, primary_key

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    op.create_table(
        "login_failures",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("key", sa.String(320), nullable=False),
        at("at"),
        primary_key("login_failures", "id"),
    )
    create_index("login_failures", "key", "at")
    create_index("login_failures", "at")


def downgrade() -> None:
    drop_index("login_failures", "at")
    drop_index("login_failures", "key", "at")
    op.drop_table("login_failures")
