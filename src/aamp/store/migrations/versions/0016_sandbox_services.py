"""The services granted to each placed sandbox (`sandboxes.services`, a JSON list of names):
what its create was allowed, recorded with its placement, so that a replica asked by the
sandbox's host for one of its service credentials decides against the grant itself, not
against a policy that may have changed since. Existing rows get none: their hosts are never
given a credential for them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("services", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("services")
