"""Heartbeat secrets (`hosts.heartbeat_hash`): each registration of a host returns a fresh
random secret, kept here only as its SHA-256, and every heartbeat of that life must carry it,
so the host's token alone cannot speak for a life it did not register. Existing hosts get
none: their next heartbeat is refused as not of their current registration, and they register
again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(sa.Column("heartbeat_hash", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("heartbeat_hash")
