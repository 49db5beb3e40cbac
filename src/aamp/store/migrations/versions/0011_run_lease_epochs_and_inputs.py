"""Run lease epochs and stored run inputs (`aamp.runs.leases`, `aamp.runs.store`).

`runs.lease_epoch` counts the leases a run has had: each take or takeover is the next one,
and every write of the run's driver names the epoch it holds, so a replica that lost the
lease (it stalled, another took the run over) has its writes refused. `run_inputs` keeps a
run's input files until the run ends, so a replica that takes the run over can put them into
its fresh sandbox. Existing runs get epoch 0 and no stored inputs.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("lease_epoch", sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "run_inputs",
        sa.Column(
            "run_id",
            sa.String(32),
            sa.ForeignKey("runs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("position", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("run_inputs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("lease_epoch")
