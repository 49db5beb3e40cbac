"""Cancel requests of runs (`aamp.runs.store`): `runs.cancel_requested_by` names who asked to
cancel a run that another control-plane replica drives. The run's driver sees it when woken
(`NOTIFY aamp_run_cancel` on PostgreSQL) or at its next lease beat, and cancels the run; a
replica taking the run over ends it cancelled instead of going on. Existing runs get none.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("cancel_requested_by", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("cancel_requested_by")
