"""Run leases: which control-plane replica drives each unfinished run, until when
(`aamp.runs.leases`). Existing runs get no lease, which counts as expired.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from aamp.store.migrations.shapes import at, create_index, drop_index

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("lease_owner", sa.String(64), nullable=True))
        batch.add_column(at("lease_until", nullable=True))
    create_index("runs", "lease_until")


def downgrade() -> None:
    drop_index("runs", "lease_until")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("lease_until")
        batch.drop_column("lease_owner")
