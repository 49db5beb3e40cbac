"""The data rules of the policy each placed sandbox was made from (`sandboxes.data_rules`,
JSON), so that any replica checks the sandbox's files in and out against them. Rows made
before this revision have none: they were made when direct file transfers were not checked.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("data_rules", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("data_rules")
