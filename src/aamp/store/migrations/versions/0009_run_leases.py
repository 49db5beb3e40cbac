"""Run leases: which control-plane replica drives each unfinished run, until when
(`aamp.runs.leases`). Existing runs get no lease, which counts as expired.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("lease_owner", sa.String(64), nullable=True))
        batch.add_column(sa.Column("lease_until", sa.String(32), nullable=True))
    op.create_index("ix_runs_lease_until", "runs", ["lease_until"])


def downgrade() -> None:
    op.drop_index("ix_runs_lease_until", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("lease_until")
        batch.drop_column("lease_owner")
