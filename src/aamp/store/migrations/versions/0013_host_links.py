"""Where each sandbox host's link listens (`hosts.link_address`, `HOST:PORT`, given at its
registration; none for a replica's own host, which it drives in its process), and who a
sandbox was made by and for (`sandboxes.owner`, `agent`, `policy`), so that any replica can
decide a request about a sandbox made on another one.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(sa.Column("link_address", sa.String(300), nullable=True))
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("owner", sa.String(256), nullable=True))
        batch.add_column(sa.Column("agent", sa.String(64), nullable=True))
        batch.add_column(sa.Column("policy", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("policy")
        batch.drop_column("agent")
        batch.drop_column("owner")
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("link_address")
